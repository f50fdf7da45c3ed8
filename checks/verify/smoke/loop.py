"""Timed training steps (child process, torch): the clocks, the data feed and the step itself.

Per optimizer step the marks are: input ready (after ``next()``), after the host-to-device copy, after forward,
after backward (per micro-batch), after the optimizer. On a GPU a mark is a CUDA event on the current stream,
read lazily after one ``synchronize()`` at the end of the window; on the CPU it is ``time.monotonic()``, exact
because CPU ops are synchronous. The intervals partition the device timeline (docs/sources.md#gpu-clock-timers):
data wait = previous step's end -> input ready, so whatever the host did between steps is counted there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, DistributedSampler

from checks.verify.smoke.data import FEWER_THAN_A_BATCH, EpochBatches, StagedDataError


class HostClock:
    """Marks are host monotonic seconds (the CPU device)."""

    def mark(self) -> Any:
        return time.monotonic()

    def seconds(self, a: Any, b: Any) -> float:
        return float(b - a)

    def finish(self) -> None:
        """Nothing is in flight on the CPU."""

    def done(self, mark: Any) -> bool:
        """A CPU mark is taken when the work before it is done."""
        return True


class CudaClock:
    """Marks are CUDA events recorded on the current stream; ``finish`` synchronizes once."""

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1000.0

    def finish(self) -> None:
        torch.cuda.synchronize()

    def done(self, mark: Any) -> bool:
        """Whether the work before the event has run (no synchronize: the stop rule reads finished steps only)."""
        return bool(mark.query())


Clock = HostClock | CudaClock


class Batches(Protocol):
    """Where a step takes its batches: a ``Feed``, or the checkpoint check's recording and replay of one."""

    def next(self) -> Any: ...


class Feed:
    """A DataLoader over ``EpochBatches`` that starts a new epoch when one ends and knows its position."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        seed: int,
        loader: dict[str, Any],
        epoch: int = 0,
        start: int = 0,
        shard: tuple[int, int] | None = None,  # (rank, world size): this rank's part of every epoch
    ):
        self.batches: Any = (
            EpochBatches(len(dataset), batch_size, seed, epoch, start)
            if shard is None
            else ShardedBatches(len(dataset), batch_size, seed, epoch, start, shard)
        )
        self.seed, self.epoch, self.consumed = seed, epoch, start
        generator = torch.Generator()
        generator.manual_seed(seed)  # worker base seeds come from here, not from the global RNG a checkpoint restores
        self.told = _Told(self.batches)
        self.loader = DataLoader(dataset, batch_sampler=self.told, generator=generator, **loader)
        self._it: Iterator[Any] | None = iter(self.loader)
        self.returned = 0  # batches of the current iterator handed out
        self.last_indices: list[int] = []  # the sample indices of the batch next() returned last

    def next(self) -> Any:
        """Return the next batch, crossing into the next epoch when this one is done."""
        assert self._it is not None, "feed closed"
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.consumed = self.epoch + 1, 0
            self.batches.epoch = self.epoch
            self._it = iter(self.loader)
            self.returned = 0
            batch = next(self._it)
        self.consumed += 1
        # The DataLoader hands batches out in the order its batch sampler yielded their indices (prefetching only
        # runs the sampler ahead), so the one returned now is the ``returned``-th the sampler yielded.
        self.last_indices = list(self.told.yielded[self.returned])
        self.returned += 1
        return batch

    def position(self) -> dict[str, int]:
        """The sampler position a checkpoint stores: the next batch is batch ``batch`` of epoch ``epoch``."""
        return {"seed": self.seed, "epoch": self.epoch, "batch": self.consumed, "batch_size": self.batches.batch_size}

    def close(self) -> None:
        """Drop the iterator, which shuts its workers down."""
        self._it = None


class _Told:
    """A batch sampler that keeps what its wrapped one yields since its last ``iter`` (the order a resume must
    reproduce, as it was drawn rather than as it should be)."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches
        self.yielded: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        self.yielded = []
        for indices in self.batches:
            self.yielded.append(indices)
            yield indices


class ShardedBatches:
    """A ``batch_sampler``: this rank's part of a seeded epoch order, cut into batches, startable mid-epoch."""

    def __init__(self, samples: int, batch_size: int, seed: int, epoch: int, start: int, shard: tuple[int, int]):
        rank_, world = shard
        positions: Any = range(samples)  # the sampler only takes the length
        self.sampler: DistributedSampler[int] = DistributedSampler(
            positions, world, rank_, shuffle=True, seed=seed, drop_last=True
        )
        self.batch_size, self.start = batch_size, start
        self.epoch = epoch
        if len(self) == 0:
            raise StagedDataError(
                f"the dataset holds {samples} samples: fewer than one batch of {batch_size} for each of {world} ranks",
                hint=FEWER_THAN_A_BATCH,
            )

    @property
    def epoch(self) -> int:
        return int(self.sampler.epoch)

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.sampler.set_epoch(value)  # the step the seed article (§4.4) says is forgotten on a resume

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.sampler)
        first, self.start = self.start, 0
        for b in range(first, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]


def loader_kwargs(settings: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """DataLoader keyword arguments from bootstrap's advice (pin memory only with a GPU to copy to)."""
    workers = int(settings["num_workers"])
    kw: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(settings["pin_memory"]) and cuda}
    if workers:
        kw["persistent_workers"] = bool(settings["persistent_workers"])
        kw["prefetch_factor"] = int(settings["prefetch_factor"] or 2)
    return kw


@dataclass
class Pending:
    """One optimizer step's marks, not yet read."""

    prev: Any
    micro: list[tuple[Any, Any, Any, Any]]
    end: Any
    host_start: float
    host_end: float
    fetch: list[tuple[float, float]]
    loss: torch.Tensor


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step, seconds on the device clock; host times are monotonic seconds."""

    data_wait: float
    h2d: float
    forward: float
    backward: float
    optimizer: float
    host_start: float
    host_end: float
    enqueue_s: float  # host time spent issuing the step (everything but waiting for batches)
    fetch: list[tuple[float, float]] = field(default_factory=list)
    loss: float = float("nan")

    @property
    def total(self) -> float:
        return self.data_wait + self.h2d + self.forward + self.backward + self.optimizer

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 7) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in ``batch`` on ``device``, however nested (dicts of ``input_ids``/``labels``, lists, tuples,
    named tuples, as torch's pytree flattens them); an object with its own ``to`` (transformers' ``BatchEncoding``)
    moves itself; anything else stays as it is."""

    def move(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return leaf.to(device, non_blocking=True)
        to = getattr(leaf, "to", None)
        return to(device) if callable(to) and not isinstance(leaf, type) else leaf

    return pytree.tree_map(move, batch)


@dataclass
class Trainer:
    """Runs optimizer steps of ``accum`` micro-batches and marks their phases."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    device: torch.device
    clock: Clock
    accum: int = 1
    autocast_dtype: torch.dtype | None = None
    scaler: Any = None

    def autocast(self) -> Any:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def to_device(self, batch: Any) -> tuple[Any, Any]:
        inputs, target = batch[0], batch[1]
        if self.device.type != "cuda":
            return inputs, target
        return to_device(inputs, self.device), to_device(target, self.device)

    def step(self, feed: Batches, prev: Any) -> Pending:
        """Run one optimizer step; ``prev`` is the mark that ended the previous one."""
        host_start, fetch, micro = time.monotonic(), [], []
        total: torch.Tensor | None = None
        for _ in range(self.accum):
            a = time.monotonic()
            batch = feed.next()
            fetch.append((a, time.monotonic()))
            ready = self.clock.mark()
            inputs, target = self.to_device(batch)
            copied = self.clock.mark()
            with self.autocast():
                loss = self.loss_fn(self.model(inputs), target)
            forward = self.clock.mark()
            scaled = loss / self.accum
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            micro.append((ready, copied, forward, self.clock.mark()))
            total = loss.detach() if total is None else total + loss.detach()
        self._optimizer_step()
        end = self.clock.mark()
        assert total is not None
        return Pending(prev, micro, end, host_start, time.monotonic(), fetch, total / self.accum)

    def _optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run_steps(trainer: Trainer, feed: Batches, count: int, prev: Any, on_step: Callable[[int], None]) -> list[Pending]:
    """Run ``count`` steps; Ctrl-C raises ``Interrupted`` carrying the steps already issued."""
    pending: list[Pending] = []
    try:
        for i in range(count):
            pending.append(trainer.step(feed, pending[-1].end if pending else prev))
            on_step(i)
    except KeyboardInterrupt:
        raise Interrupted(pending) from None
    return pending


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run of steps, carrying the steps issued before it."""

    def __init__(self, pending: list[Pending]) -> None:
        super().__init__()
        self.pending = pending


def resolve(clock: Clock, pending: list[Pending]) -> list[StepRecord]:
    """Read every mark after one synchronize and return the step records."""
    clock.finish()
    return _records(clock, pending)


def train(trainer: Trainer, feed: Batches, count: int) -> list[StepRecord]:
    """``count`` steps from a fresh mark, resolved: the extra phases' legs (no progress events, no stop rule)."""
    return resolve(trainer.clock, run_steps(trainer, feed, count, trainer.clock.mark(), lambda i: None))


def finished(clock: Clock, pending: list[Pending]) -> list[StepRecord]:
    """The records of the steps the device has finished, oldest first, without waiting for the others."""
    count = 0
    while count < len(pending) and clock.done(pending[count].end):
        count += 1
    return _records(clock, pending[:count])


def _records(clock: Clock, pending: list[Pending]) -> list[StepRecord]:
    records = []
    for p in pending:
        wait = h2d = fwd = bwd = 0.0
        prev = p.prev
        for ready, copied, forward, backward in p.micro:
            wait += clock.seconds(prev, ready)
            h2d += clock.seconds(ready, copied)
            fwd += clock.seconds(copied, forward)
            bwd += clock.seconds(forward, backward)
            prev = backward
        enqueue = (p.host_end - p.host_start) - sum(b - a for a, b in p.fetch)
        opt = clock.seconds(prev, p.end)
        records.append(StepRecord(wait, h2d, fwd, bwd, opt, p.host_start, p.host_end, enqueue, p.fetch, float(p.loss)))
    return records
