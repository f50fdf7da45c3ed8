"""Disk I/O primitives: the scratch directory, a time budget, fsynced sequential writes and cold reads.

MB is 1e6 bytes, as fio's ``bw_bytes``. The page cache of a test file is dropped with
``posix_fadvise(DONTNEED)`` after it is on the device, and ``mincore`` confirms it left; where it did not,
the read goes through ``O_DIRECT``, and failing that the figure is marked ``warm`` (an upper bound).

A scratch directory is named after its creator (``.gpu-preflight-disk-<scope>-<pid>-<start>-<random>``), so that
one left by a killed run (``kill -9`` skips every cleanup) can be told from one in use and swept by the next run.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import mmap
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import NamedTuple

from checks.probe.host import boot_id
from checks.units import MIB

CHUNK = 4 * MIB  # one write/read call, as fio --bs=4M
SCRATCH_PREFIX = ".gpu-preflight-disk-"
_OWNED = re.compile(re.escape(SCRATCH_PREFIX) + r"(?P<scope>[0-9a-f]{8})-(?P<pid>[1-9][0-9]*)-(?P<start>[0-9]+)-\w+")


class MeasureError(Exception):
    """An I/O error that ends the measurement of a location, already worded for the report."""


@functools.cache
def pattern() -> memoryview:
    """Random bytes to write, so compressing or deduplicating filesystems cannot flatter the figures."""
    return memoryview(os.urandom(CHUNK))


@contextlib.contextmanager
def scratch_dir(parent: str) -> Iterator[str]:
    """Make a hidden directory for test files under ``parent``, named after this process; remove it on every way
    out but ``kill -9`` (``sweep_stale`` takes care of that one)."""
    owner = _owner()
    prefix = f"{SCRATCH_PREFIX}{owner[0]}-{owner[1]}-{owner[2]}-" if owner else SCRATCH_PREFIX
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (/proc/<pid>/stat field 22); None for a zombie.

    Raises FileNotFoundError or ProcessLookupError when there is no such process. Exact and unique together with
    the PID, unlike psutil's create_time(), which moves when the boot time is re-derived (giampaolo/psutil#1007).
    """
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # the name in parentheses may hold spaces
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


@functools.cache
def _scope() -> str | None:
    """This boot of this machine and this PID namespace, hashed: a PID means something only within them."""
    boot = boot_id() or socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return hashlib.sha256(f"{boot}\0{namespace}".encode()).hexdigest()[:8]


def _owner() -> tuple[str, int, int] | None:
    """(scope, pid, start) naming this process; None where /proc cannot say, and then nothing is swept."""
    pid, scope = os.getpid(), _scope()
    try:
        start = _start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return None
    return None if start is None or scope is None else (scope, pid, start)


def _stale(name: str) -> bool:
    """True when ``name`` is a scratch directory of this machine and namespace whose creator is gone."""
    found = _OWNED.fullmatch(name)
    if found is None or _scope() is None or found["scope"] != _scope():
        return False
    try:
        start = _start_ticks(int(found["pid"]))
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, ValueError, IndexError):
        return False  # cannot tell: keep it
    return start != int(found["start"])  # a zombie, or the PID reused by a later process


class Swept(NamedTuple):
    """Scratch directories of killed runs removed from one location, and the bytes they held."""

    paths: tuple[str, ...] = ()
    bytes: int = 0


def _tree_bytes(top: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(top):  # os.walk does not follow symlinks to directories
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def sweep_stale(parent: str) -> Swept:
    """Remove scratch directories under ``parent`` that earlier runs left when killed.

    Only real directories (never a symlink) named by ``scratch_dir``, owned by this user, made on this boot and
    in this PID namespace by a process that is gone. Anything else, a directory on a shared filesystem made by
    another machine included, is left alone; so is what cannot be removed.
    """
    if _owner() is None:
        return Swept()
    try:
        with os.scandir(parent) as listing:
            entries = [e for e in listing if e.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return Swept()
    paths, freed = [], 0
    for entry in entries:
        try:
            ours = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
        except OSError:
            continue
        if ours and _stale(entry.name):
            size = _tree_bytes(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                paths.append(entry.path)
                freed += size
    return Swept(tuple(paths), freed)


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
