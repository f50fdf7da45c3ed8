"""Read a folder written by ``invoke stage-data`` in PyTorch (copy this one file into your project; numpy and torch only).

``staged_loader`` is the fast path: it reads whole batches from the memory-mapped images.npy (sorted indices, one
gather) into a small ring of reused buffers, in a background thread, with no DataLoader workers::

    loader = staged_loader("/scratch/imagenet-256", 256, seed=0, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:  # uint8 [B, S, S, 3], int64 [B], already on the GPU
            x = images.permute(0, 3, 1, 2).float().div_(255)

The ring's one rule: on the CPU a batch's tensors are reused for a later batch once you have taken ``KEEP`` (2)
more batches, so use or copy a batch before then (a loop that uses its batch before asking for the next never
notices). With a CUDA ``device`` the batches are fresh GPU tensors, copied from pinned buffers on a side stream
that overlaps the previous step, and the rule does not apply. ``state_dict()`` / ``load_state_dict()`` carry the
(epoch, position) a resumed run starts from; the order is a function of (seed, epoch) alone.

Under ``invoke verify -- COMMAND`` each batch's wait counts as data wait and its samples are counted, as for a
DataLoader (the loader hands its batches to verify's ``data()`` mark, which does nothing outside verify).

``StagedImages`` is the per-sample Dataset for code that needs a DataLoader (samples stay HWC uint8; convert on
the GPU). Workers only slow a staged read down: each batch a worker makes is copied into fresh shared memory.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

KEEP = 2  # batches the caller may hold: the ring's one rule (see above)


class StagedImages(Dataset):
    """(uint8 SxSx3 image tensor, int label) pairs from images.npy, labels.npy and classes.json."""

    def __init__(self, root: str | Path, transform: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")
        self.classes = json.loads((self.root / "classes.json").read_text())
        self.transform = transform
        self._images: np.ndarray | None = None  # opened on first use, in the worker process that reads it

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self._images is None:  # "c": copy-on-write, so tensors may view the map; the file is never written
            self._images = np.load(self.root / "images.npy", mmap_mode="c")
        image = torch.from_numpy(self._images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def staged_loader(
    root: str | Path,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int | None = None,
    device: str | torch.device | None = None,
    workers: int | None = None,
) -> StagedLoader:
    """Batches ``(uint8 [B, S, S, 3], int64 [B])`` of a staged folder; ``workers`` reading threads (None: 1)."""
    return StagedLoader(root, batch_size, shuffle, drop_last, seed, device, 1 if workers is None else workers)


class StagedLoader:
    """An iterable of whole batches; one pass is one epoch, after which the next epoch begins."""

    def __init__(
        self,
        root: str | Path,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int | None,
        device: str | torch.device | None,
        workers: int,
    ) -> None:
        root = Path(root)
        self.images = np.load(root / "images.npy", mmap_mode="r")
        self.labels = np.ascontiguousarray(np.load(root / "labels.npy"), dtype=np.int64)
        self.classes = json.loads((root / "classes.json").read_text())
        if len(self.images) != len(self.labels):
            raise ValueError(f"{root / 'images.npy'} holds {len(self.images)} images for {len(self.labels)} labels")
        if batch_size < 1 or workers < 0:
            raise ValueError(f"batch_size must be >= 1 and workers >= 0, got {batch_size} and {workers}")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed = int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else seed  # kept: resumable
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.workers, self.epoch, self.position = workers, 0, 0
        self.ring = KEEP + max(1, workers)  # the batches held, plus those read ahead
        self._slots = [self._slot() for _ in range(self.ring)]
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._copies: dict[int, Any] = {}  # slot -> the CUDA event after its last copy to the device

    def _slot(self) -> tuple[torch.Tensor, torch.Tensor]:
        pin = self.device.type == "cuda"  # pinned pages copy to the GPU asynchronously
        images = torch.empty((self.batch_size, *self.images.shape[1:]), dtype=torch.uint8, pin_memory=pin)
        images.numpy().fill(0)  # touch every page once, here, not on the first read (first-touch faults)
        return images, torch.empty(self.batch_size, dtype=torch.int64, pin_memory=pin)

    def __len__(self) -> int:
        full, rest = divmod(len(self.labels), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (its order is drawn from (seed, epoch)); from its first batch unless
        the loader already stands in that epoch (a state just loaded, or a pass broken off), which continues."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        """Where the next pass starts: batch ``position`` of epoch ``epoch`` (and the seed of the order)."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from a ``state_dict()``: the next pass yields what the uninterrupted run would have."""
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The sorted sample indices of each batch of ``epoch``."""
        n = len(self.labels)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        cuts = range(0, len(self) * self.batch_size, self.batch_size)
        return [np.sort(order[a : a + self.batch_size]) for a in cuts]

    def _fill(self, index: np.ndarray, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._slots[slot]
        copy = self._copies.pop(slot, None)
        if copy is not None:
            copy.synchronize()  # a pinned slot is refilled only after its copy to the GPU has finished
        n = len(index)
        # mode="clip" lets take write straight into the buffer (mode="raise" gathers into a temporary first)
        np.take(self.images, index, axis=0, out=images.numpy()[:n], mode="clip")
        np.take(self.labels, index, out=labels.numpy()[:n], mode="clip")
        return images[:n], labels[:n]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # verify -- COMMAND times each batch's wait (a no-op without it; the one line a loop of your own needs too)
        mark = getattr(sys.modules.get("_gpu_preflight_agent"), "data", None)
        return mark(self._epoch(), "staged") if mark is not None else self._epoch()

    def _epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.batch_indices(self.epoch)[self.position :]
        reader = _Reader(self, batches) if self.workers else None
        try:
            for b, index in enumerate(batches):
                batch = reader.take(b) if reader else self._fill(index, b % self.ring)
                self.position += 1
                yield self._to_device(batch, b % self.ring)
        finally:
            if reader:
                reader.stop()
        self.epoch, self.position = self.epoch + 1, 0

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor], slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._stream is None:
            return batch
        with torch.cuda.stream(self._stream):  # the copy overlaps the GPU work still queued on the main stream
            out = tuple(t.to(self.device, non_blocking=True) for t in batch)
            done = torch.cuda.Event()
            done.record(self._stream)
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        for t in out:
            t.record_stream(torch.cuda.current_stream(self.device))
        self._copies[slot] = done
        return out[0], out[1]


class _Reader:
    """Background threads that fill batch ``b`` into slot ``b % ring`` once the caller has let go of it."""

    def __init__(self, loader: StagedLoader, batches: list[np.ndarray]) -> None:
        self.loader, self.batches = loader, batches
        self.cond = threading.Condition()
        self.taken, self.stopped = 0, False
        self.error: BaseException | None = None
        self.ready: set[int] = set()
        step = loader.workers
        self.threads = [threading.Thread(target=self._run, args=(k, step), daemon=True) for k in range(step)]
        for t in self.threads:
            t.start()

    def _run(self, first: int, step: int) -> None:
        ahead = self.loader.ring - KEEP
        try:
            for b in range(first, len(self.batches), step):
                with self.cond:  # slot b % ring last held batch b - ring, released once batch b - ahead is taken
                    self.cond.wait_for(lambda: self.stopped or self.taken > b - ahead)  # noqa: B023 - called here
                    if self.stopped:
                        return
                self.loader._fill(self.batches[b], b % self.loader.ring)
                with self.cond:
                    self.ready.add(b)
                    self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def take(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self.cond:
            self.cond.wait_for(lambda: b in self.ready or self.error is not None)
            if self.error is not None:
                raise self.error
            self.ready.discard(b)
            self.taken = b + 1
            self.cond.notify_all()
        images, labels = self.loader._slots[b % self.loader.ring]
        n = len(self.batches[b])
        return images[:n], labels[:n]

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()
