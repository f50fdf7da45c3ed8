"""Turn the decoded rows (one per input, rejects as zero rows) into the published layout.

Without rejects the row file already is ``images.npy``. With rejects, the good rows are copied into a new file
from the last block backwards, and the old file is cut behind each block copied: at most one block of extra
disk is ever needed, and every step is journaled, so a kill mid-way resumes (a block is re-copied whole, from
rows the cut has not reached). ``.pt`` shards are written the same way, last shard first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from datasets import npyfile
from datasets.journal import Journal

BLOCK_ROWS = 256
Tick = Callable[[int], None]


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
