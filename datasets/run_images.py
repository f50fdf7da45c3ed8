"""The images part of a staging run: size estimate, parallel decode with the journal, rejects, final layout."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from checks.units import MIB, size_binary
from datasets import decode, finalize, manifest, npyfile, resize
from datasets.errors import StageFailure
from datasets.images import Resize
from datasets.inventory import Inventory
from datasets.journal import Journal
from datasets.manifest import Classes, Contents, Counts, Output, Reject, Timings
from datasets.progress import Progress
from datasets.request import Request, allowed_rejects
from datasets.words import count

SLOTS = "slots.npy"  # one row per input, rejects as zero rows, until finalize
SYNC_ROWS_BYTES = 64 << 20  # decoded rows made durable and journaled at a time (~340 images at 256 px)
RESERVE = "reserve.bin"  # in the staging folder: the disk held for the rows still to decode


def estimate(req: Request, inv: Inventory, work: Path | None) -> tuple[int, str, str]:
    """Return (bytes still needed, what for, a smaller alternative) for decoding ``inv`` (``work``: None before
    a staging folder exists)."""
    n, s = len(inv.paths), req.images.size
    total = n * s * s * 3 + n * 8 + MIB
    if req.format == "pt":
        total += req.images.shard_size * s * s * 3  # one shard exists twice while it is written
    held = (
        0 if work is None else npyfile.allocated_bytes(work / "out" / SLOTS) + npyfile.allocated_bytes(work / RESERVE)
    )
    half = max(8, s // 2)
    smaller = f"--size {half} needs {size_binary(n * half * half * 3)}"
    return max(0, total - held), f"{n:,} images x {s}x{s}x3 bytes", smaller


def run(req: Request, inv: Inventory, work: Path, journal: Journal, progress: Progress) -> Contents:
    """Decode every image of ``inv`` into ``work/out`` and lay it out; return what was staged (no fetch time yet)."""
    out, n, job = work / "out", len(inv.paths), req.images
    workers = decode.worker_count(req.workers, req.reserve_cores)
    decode.prestart(workers)  # stage started it already, beside the scan; a no-op then
    timing: dict[str, float] = {}
    if not journal.has("slots"):
        npyfile.create(out / SLOTS, np.dtype(np.uint8), (n, *job.row_shape), reserve=False)  # _Reserve holds it
        journal.append({"event": "slots", "rows": n})
    done_before = sum(e["stop"] - e["start"] for e in journal.all("chunk"))
    row_bytes = int(np.prod(job.row_shape))
    reserve = _Reserve(work / RESERVE, (n - done_before) * row_bytes, workers * decode.MAX_CHUNK * row_bytes)
    t = time.monotonic()
    with finalize.RowHasher(out / SLOTS, n, int(np.prod(job.row_shape))) as hasher:
        if req.format != "npy":
            hasher.stop()  # the rows become shards, never images.npy as they are
        rejects = _decode(
            req, inv, out, _Unsynced(out / SLOTS, journal, reserve, SYNC_ROWS_BYTES // row_bytes), progress,
            (workers, allowed_rejects(req.max_rejects, n)), hasher, timing,
        )  # fmt: skip
        reserve.close()
        decode_s = time.monotonic() - t
        t = time.monotonic()
        slots_sha = hasher.digest()  # None once a reject appeared: the rows get compacted into another file
    good = finalize.good_rows(n, set(rejects))
    if not len(good):
        raise StageFailure(
            f"{'the only image' if n == 1 else f'every one of the {n:,} images'} was rejected",
            hint=f"first reason: {next(iter(rejects.values()))}",
        )
    outputs = _layout(req, inv, out, good, journal, progress, slots_sha)
    return Contents(
        kind="images",
        format=req.format,
        counts=Counts(inputs=n, staged=len(good), rejected=len(rejects), tokens=0),
        outputs=outputs,
        rejects=tuple(Reject(path=inv.paths[i], reason=r) for i, r in sorted(rejects.items())),
        timings=Timings(
            fetch_s=0.0,
            decode_s=round(decode_s, 3),
            finalize_s=round(time.monotonic() - t, 3),
            total_s=0.0,
            workers_s=timing.get("workers_s", 0.0),
        ),
        classes=Classes(count=len(inv.classes), per_class=_per_class(inv.classes, np.asarray(inv.labels)[good])),
        tokenizer=None,
        items_done_before=done_before,
    )


def _decode(
    req: Request,
    inv: Inventory,
    out: Path,
    unsynced: _Unsynced,
    progress: Progress,
    limits: tuple[int, int],
    hasher: finalize.RowHasher,
    timing: dict[str, float],
) -> dict[int, str]:
    """Decode what the journal does not list as done in ``limits`` (workers, allowed rejects) processes, handing each
    finished range to ``hasher``; fail as soon as the rejects pass the allowed count; the pool's start-up goes into
    ``timing``."""
    n, (workers, allowed), journal = len(inv.paths), limits, unsynced.journal
    rejects = {int(i): r for e in journal.all("chunk") for i, r in e["rejects"]}
    if rejects:
        hasher.stop()
    done = [(e["start"], e["stop"]) for e in journal.all("chunk")]
    for start, stop in done:
        hasher.add(start, stop)
    todo = _missing(n, done)
    spec = Resize(req.images.size, req.images.policy, req.images.resample, resize.backend_id(req.images.resample))
    tasks = decode.chunks(todo, inv.path, str(out / SLOTS), spec, workers)
    bar = progress.bar("decode", n, "img", initial=n - sum(b - a for a, b in todo))
    try:
        for chunk in decode.run(tasks, workers, lambda seconds: timing.update(workers_s=round(seconds, 3))):
            unsynced.add(chunk, int(np.prod(req.images.row_shape)))
            hasher.add(chunk.start, chunk.stop)
            if chunk.rejects:
                hasher.stop()
            rejects.update(chunk.rejects)
            bar.update(chunk.stop - chunk.start)
            _check_rejects(rejects, allowed, n, inv)
    finally:
        bar.close()
        unsynced.flush()  # also on a failure: what is decoded is kept for the resume
    return rejects


class _Unsynced:
    """Decoded chunks not yet journaled: one ``fdatasync`` of the row file, then a journal line for each of them.

    The workers do not sync (decode.py): syncing every ``rows`` rows here keeps them decoding while the disk
    catches up, and a kill -9 loses (to redo) at most the chunks since the last sync. Each chunk's disk is given
    back from ``reserve`` as it lands.
    """

    def __init__(self, path: Path, journal: Journal, reserve: _Reserve, rows: int) -> None:
        self._path, self.journal, self._reserve, self._rows = path, journal, reserve, max(1, rows)
        self._chunks: list[decode.ChunkDone] = []

    def add(self, chunk: decode.ChunkDone, row_bytes: int) -> None:
        self._reserve.give_back((chunk.stop - chunk.start) * row_bytes)
        self._chunks.append(chunk)
        if sum(c.stop - c.start for c in self._chunks) >= self._rows:
            self.flush()

    def flush(self) -> None:
        """Make the chunks durable, then record them (the rows reach the disk before the journal says they did)."""
        if not self._chunks:
            return
        fd = os.open(self._path, os.O_WRONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        for chunk in self._chunks:
            event = {
                "event": "chunk",
                "start": chunk.start,
                "stop": chunk.stop,
                "rejects": [list(r) for r in chunk.rejects],
            }
            self.journal.append(event)
        self._chunks = []


class _Reserve:
    """Disk held for the rows still to decode, in a file of its own that shrinks as the rows land.

    Not ``posix_fallocate`` of the row file itself: buffered writes into its reserved (unwritten) blocks at times
    ran at the disk's pace on the 2-core box's ext4 (mounted with ``discard``; 109-290 MiB/s, right after a large
    file was deleted, against ~4,000 MiB/s into a file without them), which held the whole decode to the disk.
    ``headroom`` is what the workers may write before their chunks reach this process (a chunk each), so the two
    files never hold more than the rows.
    """

    def __init__(self, path: Path, rows_bytes: int, headroom: int) -> None:
        self._path, self._size = path, max(0, rows_bytes - headroom)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if self._size:
                npyfile.reserve_space(fd, self._size)  # a full disk fails here, before any decoding
        finally:
            os.close(fd)

    def give_back(self, nbytes: int) -> None:
        if self._size:
            self._size = max(0, self._size - nbytes)
            os.truncate(self._path, self._size)

    def close(self) -> None:
        self._path.unlink(missing_ok=True)


def _check_rejects(rejects: dict[int, str], allowed: int, n: int, inv: Inventory) -> None:
    if len(rejects) <= allowed:
        return
    first = sorted(rejects.items())[:3]
    listed = "; ".join(f"{inv.paths[i]}: {r}" for i, r in first)
    raise StageFailure(
        f"{count(len(rejects), 'image')} rejected (of {n:,}), more than --max-rejects allows ({allowed:,}): {listed}",
        hint="fix or remove them, or raise --max-rejects; the same command then resumes",
    )


def _missing(n: int, done: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Return the ranges of [0, n) not covered by ``done``."""
    todo, pos = [], 0
    for start, stop in sorted(done):
        if start > pos:
            todo.append((pos, start))
        pos = max(pos, stop)
    return [*todo, (pos, n)] if pos < n else todo


def _layout(
    req: Request,
    inv: Inventory,
    out: Path,
    good: np.ndarray,
    journal: Journal,
    progress: Progress,
    slots_sha: str | None,
) -> dict[str, Output]:
    """Write the published files into ``out`` and describe them (sizes, hashes, shapes); ``slots_sha`` is the
    row file's sha256 when it was hashed during the decode."""
    slots, labels = out / SLOTS, np.asarray(inv.labels, dtype=np.int64)[good]
    known: dict[str, str] = {}
    bar = progress.bar("finish", len(good), "img")
    try:
        if req.format == "pt":
            finalize.write_shards(slots, out, good, labels, req.images.shard_size, journal, bar.update)
        elif slots.exists() and len(good) == len(inv.paths):
            slots.rename(out / "images.npy")  # no rejects: the rows already are the dataset
            known = {"images.npy": slots_sha} if slots_sha else {}
        elif slots.exists():
            finalize.compact(slots, out / "images.npy", good, req.images.row_shape, journal, bar.update)
    finally:
        bar.close()
    if req.format == "npy":
        finalize.write_npy(out / "labels.npy", labels)
    finalize.write_text(out / "classes.json", json.dumps(list(inv.classes), indent=1) + "\n")
    return describe(out, progress, known)


def _per_class(classes: tuple[str, ...], labels: np.ndarray) -> dict[str, int]:
    counts = Counter(labels.tolist())
    names = classes or tuple(str(i) for i in sorted(counts))
    return {name: counts.get(i, 0) for i, name in enumerate(names)}


def describe(out: Path, progress: Progress, known: Mapping[str, str] | None = None) -> dict[str, Output]:
    """Hash the outputs with a progress bar (large datasets take a while); ``known`` holds sha256s already taken."""
    known = known or {}
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file() and p.name not in known)
    bar = progress.bar("hash", total, "B")
    try:
        return manifest.describe_outputs(out, bar.update, known)
    finally:
        bar.close()
