"""Turn the decoded rows (one per input, rejects as zero rows) into the published layout.

Without rejects the row file already is ``images.npy``. With rejects, the good rows are copied into a new file
from the last block backwards, and the old file is cut behind each block copied: at most one block of extra
disk is ever needed, and every step is journaled, so a kill mid-way resumes (a block is re-copied whole, from
rows the cut has not reached). ``.pt`` shards are written the same way, last shard first.

``RowHasher`` hashes the row file while it is decoded, so that when it becomes ``images.npy`` unchanged (no
rejects) its sha256 is ready and the finishing step does not read it again.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np

from datasets import npyfile
from datasets.journal import Journal

BLOCK_ROWS = 256
HASH_BLOCK = 8 << 20  # bytes per read of the hashing thread; a stop waits for at most one block
Tick = Callable[[int], None]


class RowHasher:
    """The sha256 of a row file (header, then ``rows`` rows of ``row_bytes``), fed as decoded row ranges land.

    A sha256 only goes forward, so a range that lands ahead of a gap waits until the gap is filled; each new stretch
    of the file's finished prefix is read back (from the page cache: it was just written) and hashed in one
    background thread, beside the decode (``pread`` and hashlib let go of the GIL). Use it as a context manager;
    ``digest`` then gives what ``transfer.file_sha256`` of the whole file would, or None when it cannot (stopped,
    a range never landed, a read failed, the file's size is not the array's).
    """

    def __init__(self, path: Path, rows: int, row_bytes: int) -> None:
        self._size = npyfile.HEADER_BYTES + rows * row_bytes
        self._row_bytes = row_bytes
        self._sha = hashlib.sha256()
        self._queued = 0  # bytes of the file's prefix handed to the thread
        self._waiting: list[tuple[int, int]] = []  # landed byte ranges beyond that prefix (a heap)
        self._stopped = threading.Event()
        self._failed = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="row-hash")
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None
            self._stopped.set()
        self._land(0, npyfile.HEADER_BYTES)

    def __enter__(self) -> RowHasher:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        self._thread.shutdown(wait=True, cancel_futures=True)
        if self._fd is not None:
            os.close(self._fd)

    def add(self, start: int, stop: int) -> None:
        """Rows ``start`` to ``stop`` are on disk and final."""
        base = npyfile.HEADER_BYTES
        self._land(base + start * self._row_bytes, base + stop * self._row_bytes)

    def stop(self) -> None:
        """Give up (the file will not be published as it is); blocks already queued are skipped."""
        self._stopped.set()

    def digest(self) -> str | None:
        """Wait for the queued blocks and return the file's sha256 as a hex string, or None."""
        if self._stopped.is_set() or self._queued != self._size or self._fd is None:
            return None
        self._thread.submit(lambda: None).result()  # one thread, first in first out: everything before is done
        if self._failed or self._stopped.is_set() or os.fstat(self._fd).st_size != self._size:
            return None
        return self._sha.hexdigest()

    def _land(self, start: int, stop: int) -> None:
        heapq.heappush(self._waiting, (start, stop))
        while self._waiting and self._waiting[0][0] <= self._queued:
            _, end = heapq.heappop(self._waiting)
            for offset in range(self._queued, end, HASH_BLOCK):
                self._thread.submit(self._hash, offset, min(HASH_BLOCK, end - offset))
            self._queued = max(self._queued, end)

    def _hash(self, offset: int, length: int) -> None:
        if self._stopped.is_set() or self._failed or self._fd is None:
            return
        try:
            block = os.pread(self._fd, length, offset)
        except OSError:
            block = b""
        if len(block) != length:
            self._failed = True
            return
        self._sha.update(block)


def good_rows(n: int, rejected: set[int]) -> np.ndarray:
    """Return the indices of the items that were not rejected, in order."""
    keep = np.ones(n, dtype=bool)
    keep[list(rejected)] = False
    return np.flatnonzero(keep)


def compact(
    slots: Path, final: Path, good: np.ndarray, row_shape: tuple[int, ...], journal: Journal, tick: Tick
) -> None:
    """Write only the ``good`` rows of ``slots`` into ``final`` (an .npy), journaled block by block."""
    row_bytes = int(np.prod(row_shape))
    done = journal.last("compact")
    if done is None:
        npyfile.create(final, np.dtype(np.uint8), (len(good), *row_shape), reserve=False)
        nxt = len(good)
    else:
        nxt = int(done["next"])
    if nxt == 0:  # finished before a kill that came ahead of the next journal line
        slots.unlink(missing_ok=True)
        return
    src = os.open(slots, os.O_RDWR)
    dst = os.open(final, os.O_RDWR)
    try:
        while nxt > 0:
            first = max(0, nxt - BLOCK_ROWS)
            rows = _gather(src, good[first:nxt], row_shape)
            npyfile.write_rows(dst, first, rows)
            os.fdatasync(dst)
            journal.append({"event": "compact", "next": first})
            os.ftruncate(src, npyfile.HEADER_BYTES + int(good[first]) * row_bytes)  # give back what was copied
            tick(nxt - first)
            nxt = first
    finally:
        os.close(src)
        os.close(dst)
    slots.unlink()


def write_shards(
    slots: Path, out: Path, good: np.ndarray, labels: np.ndarray, shard_size: int, journal: Journal, tick: Tick
) -> list[str]:
    """Write the good rows as ``shard-NNNNN.pt`` files of ``shard_size`` samples, last shard first."""
    import torch  # only --format pt needs torch; the task checks it is importable before decoding

    count = max(1, -(-len(good) // shard_size))
    names = [f"shard-{k:05d}.pt" for k in range(count)]
    written = {int(e["index"]) for e in journal.all("shard")}
    if len(written) == count:
        slots.unlink(missing_ok=True)
        return names
    row_shape = _row_shape(slots)
    src = os.open(slots, os.O_RDWR)
    try:
        for k in reversed(range(count)):
            idx = good[k * shard_size : (k + 1) * shard_size]
            if k not in written:
                images = torch.from_numpy(_gather(src, idx, row_shape))
                tmp = out / f".{names[k]}.tmp"
                shard_labels = labels[k * shard_size : (k + 1) * shard_size].copy()  # labels are already compacted
                torch.save({"images": images, "labels": torch.from_numpy(shard_labels)}, tmp)
                _fsync_file(tmp)
                tmp.replace(out / names[k])
                journal.append({"event": "shard", "index": k})
                tick(len(idx))
            if len(idx):
                os.ftruncate(src, npyfile.HEADER_BYTES + int(idx[0]) * int(np.prod(row_shape)))
    finally:
        os.close(src)
    slots.unlink()
    return names


def write_npy(path: Path, array: np.ndarray) -> None:
    """Write a small array as .npy through a temporary name, fsynced."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        np.save(fh, array)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def write_text(path: Path, text: str) -> None:
    """Write a small text file through a temporary name, fsynced."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def fsync_dir(path: Path) -> None:
    """Make the names created in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _gather(fd: int, rows: np.ndarray, row_shape: tuple[int, ...]) -> np.ndarray:
    """Read the given row indices (runs of consecutive rows in one read each)."""
    out = np.empty((len(rows), *row_shape), dtype=np.uint8)
    k = 0
    for run in np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1):
        if len(run):
            out[k : k + len(run)] = npyfile.read_rows(fd, int(run[0]), len(run), row_shape, np.dtype(np.uint8))
            k += len(run)
    return out


def _row_shape(path: Path) -> tuple[int, ...]:
    """Read the row shape from the header (the file may already be cut shorter than its header says)."""
    with path.open("rb") as fh:
        np.lib.format.read_magic(fh)
        shape, _, _ = np.lib.format.read_array_header_1_0(fh)
    return tuple(shape[1:])


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
