"""Checkpoint round trip (child process, torch): save everything a resume needs, time it, reload, compare.

The two legs after the save point train on the *same* batches: the first leg's are kept (``Recording``) and fed
again after the reload (``Replay``), so the loss comparison proves the model, optimizer, scaler, RNG and step state
whatever the data pipeline draws. The loader rebuilt from the saved position still runs beside the replay, as it
would on a real resume, and what it yields is compared with the kept batches on its own (``same_batches``): the
data order and augmentation resume exactly, or not (random transforms in DataLoader workers never do: the
workers reseed from the loader's base seed when the iterator is re-created; docs/sources.md#dataloader-seeding).

What is saved is what the seed article §4.4 says a resume needs, plus what it warns is forgotten: model,
optimizer, scaler, epoch/step, loss, the RNG states of python/numpy/torch/CUDA, and the sampler position. The file
is written to a temporary name, fsynced, renamed over the final name and the directory fsynced, so a crash never
leaves a torn checkpoint under the real name. It loads with ``weights_only=True``: the RNG states are stored as
plain tuples, lists and tensors for that.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_NAME = "gpu-preflight-verify.pt"
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP wrappers, torch.compile's wrapper


def rng_state() -> dict[str, Any]:
    """Capture python, numpy, torch and (when present) every CUDA device's RNG state."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos)},
        "numpy_gauss": (int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    random.setstate(state["python"])
    n = state["numpy"]
    has_gauss, cached = state["numpy_gauss"]
    # A checkpoint loaded with map_location="cuda" (as users load one) brings these tensors back on the GPU;
    # numpy and torch's setters take host tensors only.
    np.random.set_state((n["name"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop ``module.`` (DDP/DataParallel) and ``_orig_mod.`` (torch.compile) from the keys (seed article §4.4)."""
    out = {}
    for key, value in state_dict.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


@dataclass(frozen=True)
class SaveStats:
    path: str
    bytes: int
    seconds: float  # serialise + write + fsync + rename + directory fsync


def save_atomic(payload: dict[str, Any], directory: Path) -> SaveStats:
    """Write ``payload`` to ``directory`` atomically and durably; time the whole of it."""
    final = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    start = time.perf_counter()
    try:
        with tmp.open("wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return SaveStats(str(final), final.stat().st_size, time.perf_counter() - start)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (a directory fsync; some filesystems refuse it, which changes nothing here)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str, device: torch.device) -> tuple[dict[str, Any], float]:
    """Load a checkpoint with ``weights_only=True``; return it and the seconds it took."""
    start = time.perf_counter()
    payload = torch.load(path, map_location=device, weights_only=True)
    return payload, time.perf_counter() - start


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic kernels for both legs of the comparison (cuDNN picks atomics-based ones otherwise)."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    bench = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[1], bench


def compare(uninterrupted: list[float], resumed: list[float], rtol: float) -> dict[str, Any]:
    """Judge the losses of the steps after the checkpoint: equal (within ``rtol``; 0 means bit for bit)."""
    diffs = [abs(a - b) for a, b in zip(uninterrupted, resumed, strict=True)]
    worst = max((d / max(abs(a), 1e-12) for d, a in zip(diffs, uninterrupted, strict=True)), default=0.0)
    same = all(a == b for a, b in zip(uninterrupted, resumed, strict=True)) or (rtol > 0 and worst <= rtol)
    return {
        "reproduced": bool(same and len(uninterrupted) == len(resumed) and uninterrupted),
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "max_rel_diff": worst,
    }


def _clone(batch: Any) -> Any:
    """A deep copy of the tensors of a batch (the model may change its input in place)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*map(_clone, batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_clone(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _clone(v) for k, v in batch.items()}
    return batch


class Recording:
    """A feed that passes ``feed``'s batches on and keeps a copy of each."""

    def __init__(self, feed: Any) -> None:
        self.feed = feed
        self.kept: list[Any] = []
        self.indices: list[list[int] | None] = []  # each kept batch's sample indices (None: a feed that can't tell)

    def next(self) -> Any:
        batch = self.feed.next()
        self.kept.append(_clone(batch))
        self.indices.append(_indices(self.feed))
        return batch


def _indices(feed: Any) -> list[int] | None:
    told = getattr(feed, "last_indices", None)
    return None if told is None else list(told)


class Replay:
    """A feed that draws from the resumed ``feed`` (as a real resume would) but hands out the ``kept`` batches."""

    def __init__(self, feed: Any, kept: list[Any]) -> None:
        self.feed, self.kept = feed, list(kept)
        self.drawn: list[Any] = []
        self.indices: list[list[int] | None] = []

    def next(self) -> Any:
        self.drawn.append(_clone(self.feed.next()))
        self.indices.append(_indices(self.feed))
        return self.kept[len(self.drawn) - 1]


def _leaves(batch: Any) -> list[Any]:
    if isinstance(batch, (list, tuple)):
        return [leaf for b in batch for leaf in _leaves(b)]
    if isinstance(batch, dict):
        return [leaf for k in sorted(batch) for leaf in _leaves(batch[k])]
    return [batch]


def _equal(a: Any, b: Any) -> bool:
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def same_batches(
    uninterrupted: list[Any],
    resumed: list[Any],
    order: tuple[Sequence[list[int] | None], Sequence[list[int] | None]] | None = None,
) -> dict[str, Any]:
    """Whether the resumed loader yields the batches the uninterrupted run had, bit for bit, and where not, what.

    ``order``: the sample indices each leg's sampler yielded (``Recording.indices``, ``Replay.indices``);
    ``order_same`` compares them. Without them the targets (second item) stand in, which cannot tell a new order
    from targets that random transforms change (boxes flipped with the image). ``differs``: the parts that
    differ in at least one batch, ``inputs`` (the first item, or the whole batch) and ``targets`` (the second).
    """
    pairs = list(zip(uninterrupted, resumed, strict=True))
    differ = [i for i, (a, b) in enumerate(pairs) if not _equal(a, b)]
    targets = [i for i, (a, b) in enumerate(pairs) if not _equal(_target(a), _target(b))]
    inputs = [i for i, (a, b) in enumerate(pairs) if not _equal(_inputs(a), _inputs(b))]
    told = order is not None and None not in (*order[0], *order[1])
    same_order = list(order[0]) == list(order[1]) if order is not None and told else not targets
    return {
        "batches": len(pairs),
        "exact": bool(pairs) and not differ,
        "order_same": same_order,
        "first_difference": differ[0] if differ else None,
        "differs": [part for part, where in (("inputs", inputs), ("targets", targets)) if where],
    }


def _inputs(batch: Any) -> Any:
    return batch[0] if isinstance(batch, (list, tuple)) and len(batch) > 1 else batch


def _target(batch: Any) -> Any:
    return batch[1] if isinstance(batch, (list, tuple)) and len(batch) > 1 else None
