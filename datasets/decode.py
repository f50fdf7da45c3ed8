"""Decode images in parallel, straight into their rows of the output file.

Each worker decodes a chunk of consecutive items into memory and writes it with one ``pwrite`` at the chunk's
own offset, so workers never wait on each other, nor on the disk: the parent makes the rows durable (one
``fdatasync`` for many chunks, run_images) and only then journals which ranges are on disk. A rejected item
leaves a zero row that the finishing step drops. Workers die with the staging process
(PR_SET_PDEATHSIG), so a killed run leaves nobody writing behind it.

Workers come from a fork server, not ``spawn``, and are started with a stand-in main module. A spawned worker
is a fresh interpreter that re-runs the main script (for ``invoke stage-data``, Invoke's entry script, which
imports Invoke: multiprocessing.spawn's ``_fixup_main_from_path``) and imports this module, ~0.3 s of its own
before its first image; a fork server's worker re-runs the main script too. Decoding needs nothing from the main
module, so the pool is built while ``sys.modules["__main__"]`` is a bare module, as under ``python -c``: the
workers then run no main script at all. The fork server is one fresh, single-threaded interpreter (no inherited
locks or threads, as with spawn) that imports this module once; each worker is a fork of it, ready in
milliseconds, and ``prestart`` starts it before the pool is needed so that its start-up overlaps the staging
process's own steps. This module imports only what decoding needs (numpy, Pillow, the SIMD resizer, images,
npyfile): the host probe that sizes the pool is imported where it is used, in the staging process.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from datasets import npyfile
from datasets.images import RejectedImage, Resize, decode_file

MAX_CHUNK = 64  # items per task: ~12 MiB of 256 px rows in memory per worker, and fine-grained resume
CHUNKS_PER_WORKER = 16
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChunkTask:
    """Decode ``paths`` into rows ``start ..`` of the uint8 array file ``out``."""

    start: int
    paths: tuple[str, ...]
    out: str
    spec: Resize


@dataclass(frozen=True)
class ChunkDone:
    """Rows ``start`` to ``stop`` are on disk; ``rejects`` are (item index, reason)."""

    start: int
    stop: int
    rejects: tuple[tuple[int, str], ...]


def usable_cores() -> int:
    """Decode processes this machine runs at once: the usable cores (affinity, cgroup quota; docs/sources.md#usable-cores) rounded up."""
    from checks.probe.host import read_host  # the staging process only: workers import nothing of the probe

    return read_host(processes=lambda: []).process_slots


def worker_count(requested: int, reserve: int) -> int:
    """Return ``requested`` workers, or (when 0) the usable cores less ``reserve``, at least one."""
    return requested if requested > 0 else max(1, usable_cores() - max(reserve, 0))


def decode_chunk(task: ChunkTask) -> ChunkDone:
    """Decode one chunk and write its rows; rejected items become zero rows."""
    size = task.spec.size
    rows = np.zeros((len(task.paths), size, size, 3), dtype=np.uint8)
    rejects: list[tuple[int, str]] = []
    for k, path in enumerate(task.paths):
        try:
            rows[k] = decode_file(path, task.spec)
        except RejectedImage as exc:
            rejects.append((task.start + k, str(exc)))
    fd = os.open(task.out, os.O_WRONLY)
    try:
        npyfile.write_rows(fd, task.start, rows)  # not synced here: run_images syncs many chunks at once
    finally:
        os.close(fd)
    return ChunkDone(task.start, task.start + len(task.paths), tuple(rejects))


def chunks(
    todo: list[tuple[int, int]], paths: Callable[[int], str], out: str, spec: Resize, workers: int
) -> list[ChunkTask]:
    """Split the ``todo`` ranges into tasks small enough to keep every worker busy to the end."""
    remaining = sum(stop - start for start, stop in todo)
    # At least 16 tasks per worker: a kill -9 loses the chunks in flight (up to one per worker), so on a small
    # source they must be small for a resume to redo little; on a large one MAX_CHUNK bounds them.
    step = max(1, min(MAX_CHUNK, remaining // (workers * CHUNKS_PER_WORKER)))
    tasks = []
    for start, stop in todo:
        for a in range(start, stop, step):
            b = min(stop, a + step)
            tasks.append(ChunkTask(a, tuple(paths(i) for i in range(a, b)), out, spec))
    return tasks


def run(
    tasks: Iterable[ChunkTask], workers: int, started: Callable[[float], None] = lambda seconds: None
) -> Iterator[ChunkDone]:
    """Yield each finished chunk (in completion order); one worker decodes in this process.

    ``started`` hears how long the pool took to start (0 in this process): the fork server's start-up, less what
    ``prestart`` overlapped, and the forks.
    """
    if workers <= 1:
        started(0.0)
        yield from map(decode_chunk, tasks)
        return
    ctx = pool_context()
    t = time.monotonic()
    with _bare_main():  # the pool starts its workers here; one restarted later would run the main script
        pool = ctx.Pool(workers, initializer=_die_with_parent, initargs=(os.getpid(),))
    started(time.monotonic() - t)
    with pool:
        yield from pool.imap_unordered(decode_chunk, tasks)


def prestart(workers: int) -> None:
    """Start the fork server now, so that its interpreter start-up and imports overlap the work before the decode."""
    if workers <= 1:
        return
    ctx = pool_context()
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    with _bare_main():
        forkserver.ensure_running()  # returns once the server is spawned; it imports this module meanwhile


def pool_context() -> multiprocessing.context.BaseContext:
    """Return the fork-server context with this module preloaded; spawn where there is no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Not "__main__" (which would load the main script once in the server): in Pythons 3.11-3.13 it does nothing,
    # as forkserver.ensure_running asks the preparation data for "main_path" where spawn names it
    # "init_main_from_path", and each fork then re-runs the script. Ignored when a fork server already runs.
    ctx.set_forkserver_preload([__name__])
    return ctx


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """Have processes started in this block run no main script: a ``__main__`` with no file and no spec."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _die_with_parent(staging: int) -> None:
    """Have the kernel kill this worker when the staging process dies (Linux); never outlive it.

    The worker's parent is the fork server, which exits as soon as the staging process is gone (its end of a pipe
    closes), so the kill comes one hop later; under spawn the parent is the staging process itself.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the staging process's to handle
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or not _alive(staging):  # gone before prctl took effect
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True
