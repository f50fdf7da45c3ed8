"""Disk I/O primitives: the scratch directory, a time budget, fsynced sequential writes and cold reads.

MB is 1e6 bytes, as fio's ``bw_bytes``. The page cache of a test file is dropped with
``posix_fadvise(DONTNEED)`` after it is on the device, and ``mincore`` confirms it left; where it did not,
the read goes through ``O_DIRECT``, and failing that the figure is marked ``warm`` (an upper bound).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from types import FrameType

MIB = 1024**2
GIB = 1024**3
CHUNK = 4 * MIB  # one write/read call, as fio --bs=4M
SCRATCH_PREFIX = ".gpu-preflight-disk-"


class MeasureError(Exception):
    """An I/O error that ends the measurement of a location, already worded for the report."""


@functools.cache
def pattern() -> memoryview:
    """Random bytes to write, so compressing or deduplicating filesystems cannot flatter the figures."""
    return memoryview(os.urandom(CHUNK))


@contextlib.contextmanager
def scratch_dir(parent: str) -> Iterator[str]:
    """Make a hidden directory for test files under ``parent``; remove it on every way out."""
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While measuring, SIGTERM and SIGHUP (a closed SSH session) raise KeyboardInterrupt, so cleanup runs.

    Only in the main thread (signal handlers live there); a signal the process ignores stays ignored (nohup).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s, handler in old.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class Budget:
    """Seconds for one location, handed out in shares."""

    def __init__(self, seconds: float) -> None:
        self.total = seconds
        self.start = time.monotonic()

    def share(self, fraction: float) -> float:
        return max(0.05, self.total * fraction)

    def left(self) -> float:
        return self.total - (time.monotonic() - self.start)


def worded(exc: OSError, doing: str) -> MeasureError:
    """Turn an OSError into the sentence the report shows."""
    reasons = {
        errno.ENOSPC: "disk full",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only filesystem",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EIO: "I/O error (a failing disk or a dropped network mount)",
    }
    return MeasureError(f"{reasons.get(exc.errno or 0, exc.strerror or str(exc))} while {doing}")


def seq_write(path: str, max_bytes: int, seconds: float, sync_bytes: int) -> tuple[int, float]:
    """Write up to ``max_bytes`` with an fdatasync every ``sync_bytes``; return (bytes, seconds incl. fsync).

    Stops early when another sync interval would overrun ``seconds``.
    """
    buf, written, since_sync, last_interval = pattern(), 0, 0, 0.0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    start = mark = time.perf_counter()
    try:
        while written < max_bytes:
            n = os.write(fd, buf[: min(CHUNK, max_bytes - written)])
            written, since_sync = written + n, since_sync + n
            if since_sync >= sync_bytes:
                os.fdatasync(fd)
                now = time.perf_counter()
                since_sync, last_interval, mark = 0, now - mark, now
                if now - start + last_interval > seconds:
                    break
        os.fsync(fd)
    except OSError as exc:
        raise worded(exc, f"writing the test file ({written // MIB} MiB written)") from None
    finally:
        os.close(fd)
    return written, time.perf_counter() - start


def resident_fraction(fd: int, size: int) -> float | None:
    """Share of the file's pages in the page cache (``mincore``); None where that cannot be asked."""
    if size <= 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, AttributeError):
        return None
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
    finally:
        del anchor
        mapped.close()
    return None if rc != 0 else sum(int(b) & 1 for b in vec) / pages


def drop_cache(path: str) -> bool:
    """Evict a clean file from the page cache; True when mincore confirms it left (or cannot tell)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        resident = resident_fraction(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return resident is None or resident < 0.1


def _read_all(fd: int, buf: mmap.mmap | bytearray, seconds: float) -> tuple[int, float]:
    total, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n = os.readv(fd, [buf])
        if n <= 0:
            break
        total += n
    return total, time.perf_counter() - start


def cold_read(path: str, seconds: float) -> tuple[int, float, str]:
    """Read the file sequentially with its cache dropped; return (bytes, seconds, method)."""
    method = "fadvise" if drop_cache(path) else "o_direct"
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if method == "o_direct" else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # O_DIRECT refused (tmpfs, some FUSE): the cache stays, the figure is an upper bound
        fd, method = os.open(path, os.O_RDONLY | os.O_CLOEXEC), "warm"
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    try:
        total, spent = _read_all(fd, buf, seconds)
    except OSError as exc:
        raise worded(exc, "reading the test file back") from None
    finally:
        os.close(fd)
        buf.close()
    return total, spent, method


def mb_s(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e6, 1) if seconds > 0 and nbytes > 0 else None
