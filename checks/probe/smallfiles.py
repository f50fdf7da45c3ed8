"""Small-file reads, the ImageFolder workload: many ~100 KB files written, synced, evicted from the page cache,
then opened and read in random order by several threads (as DataLoader workers would)."""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time

from checks.config import DiskConfig
from checks.probe.diskio import Budget, drop_cache, pattern, worded


def _write_small(directory: str, count: int, size: int, seconds: float) -> list[str]:
    buf, names, start = pattern(), [], time.monotonic()
    span = max(1, len(buf) - size)
    for i in range(count):
        if i >= 16 and time.monotonic() - start > seconds:
            break
        name = os.path.join(directory, f"{i:06d}.bin")
        with open(name, "wb") as fh:
            offset = (i * 4099) % span
            fh.write(buf[offset : offset + size])
        names.append(name)
    return names


def _settle(names: list[str], directory: str) -> None:
    """Put the small files on the device (syncfs when libc has it), then evict them from the cache."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        synced = getattr(ctypes.CDLL(None), "syncfs", None)
        if synced is None or synced(fd) != 0:
            for name in names:
                with open(name, "rb+") as fh:
                    os.fsync(fh.fileno())
    finally:
        os.close(fd)
    for name in names:
        drop_cache(name)


def _read_files(names: list[str], size: int, deadline: float) -> int:
    buf, done = bytearray(size + 4096), 0
    for name in names:
        if time.monotonic() > deadline:
            break
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while os.readv(fd, [buf]) > 0:
                pass
        finally:
            os.close(fd)
        done += 1
    return done


def small_files(scratch: str, cfg: DiskConfig, budget: Budget) -> dict[str, object]:
    """Create ~100 KB files, drop their cache, and read them in random order with several threads."""
    directory, size = os.path.join(scratch, "small"), cfg.small_file_kib * 1024
    os.mkdir(directory)
    try:
        names = _write_small(directory, cfg.max_small_files, size, budget.share(0.15))
        _settle(names, directory)
    except OSError as exc:
        raise worded(exc, "creating the small files") from None
    random.Random(0).shuffle(names)
    threads, deadline = max(1, cfg.read_threads), time.monotonic() + budget.share(0.1)
    counts = [0] * threads
    workers = [
        threading.Thread(target=lambda k=k: counts.__setitem__(k, _read_files(names[k::threads], size, deadline)))
        for k in range(threads)
    ]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    spent = time.perf_counter() - start
    read = sum(counts)
    rate = round(read / spent, 1) if spent > 0 and read else None
    return {"small_files_per_s": rate, "small_files": read, "small_file_bytes": size}
