"""The disk part of the seam: candidate locations for data and checkpoints, and their measurement.

Measuring a location writes test files into a hidden scratch directory there, removed on every path out
(Ctrl-C, SIGTERM and SIGHUP included), within a time budget; one that a ``kill -9`` left is swept by the next
measurement of the location; the I/O primitives are in
``checks/probe/diskio.py`` (sequential) and ``checks/probe/smallfiles.py``, fio in ``checks/probe/fio.py``, the
mount table in ``checks/probe/mounts.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import replace

from checks.config import DiskConfig
from checks.errors import terminate_as_interrupt
from checks.facts import DiskFacts, LocationFacts, MountFacts
from checks.probe.diskio import (
    CHUNK,
    Budget,
    MeasureError,
    cold_read,
    mb_s,
    scratch_dir,
    seq_write,
    sweep_stale,
)
from checks.probe.fio import fio_available, fio_sequential
from checks.probe.mounts import mount_of, read_mounts, statvfs
from checks.probe.smallfiles import small_files
from checks.units import GIB, MIB


def candidates(mounts: list[MountFacts], cfg: DiskConfig, home: str, tmp: str) -> list[tuple[str, bool]]:
    """(path, explicit) to measure: the configured list, else home, tmp and each other writable filesystem."""
    if cfg.locations:
        listed = [(os.path.expanduser(p), True) for p in cfg.locations]
        return _dedupe_paths(listed)[: cfg.max_locations]
    found = [home, tmp] + [m.mountpoint for m in mounts if _auto_candidate(m)]
    usable = [(p, False) for p in found if os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)]
    return _dedupe_devices(usable)[: cfg.max_locations]


def _auto_candidate(m: MountFacts) -> bool:
    return m.kind != "memory" and not m.read_only and m.error is None and m.mountpoint != "/"


def _dedupe_paths(paths: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    return list(dict.fromkeys(paths))


def _dedupe_devices(paths: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Keep one location per filesystem (st_dev): the first path found on it."""
    seen: set[int] = set()
    out = []
    for path, explicit in paths:
        try:
            dev = os.stat(path).st_dev
        except OSError:
            continue
        if dev not in seen:
            seen.add(dev)
            out.append((path, explicit))
    return out


def precondition(path: str, mount: MountFacts | None, cfg: DiskConfig) -> str | None:
    """Say why a location cannot be measured (missing, read-only, full); None when it can."""
    if not os.path.exists(path):
        return "does not exist"
    if not os.path.isdir(path):
        return "is not a directory"
    if mount is not None and mount.read_only:
        return f"read-only filesystem ({mount.mountpoint} is mounted ro)"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable by this user (permission denied)"
    try:
        st = statvfs(path, cfg.stat_timeout_s)
    except (OSError, TimeoutError) as exc:
        return f"statvfs failed: {exc}"
    free = st.f_bavail * st.f_frsize
    if free < cfg.min_free_mib * MIB:
        return f"disk full: {free / MIB:.0f} MiB free, less than the {cfg.min_free_mib} MiB needed to measure"
    return None


def measure_location(path: str, explicit: bool, mounts: list[MountFacts], cfg: DiskConfig) -> LocationFacts:
    """Measure one location within ``cfg.budget_s``; test files never outlive the call."""
    start = time.monotonic()
    mount = mount_of(path, mounts)
    base = LocationFacts(
        path=path,
        explicit=explicit,
        mountpoint=mount.mountpoint if mount else None,
        fs_type=mount.fs_type if mount else None,
        kind=mount.kind if mount else None,
        free_bytes=mount.free_bytes if mount else None,
    )
    problem = precondition(path, mount, cfg)
    if problem is None or problem.startswith("disk full"):  # what a killed run left may be what fills it
        base, problem = _swept(base, problem, mount, cfg)
    if problem:
        return replace(base, error=problem, seconds=round(time.monotonic() - start, 3))
    use_fio = cfg.use_fio and fio_available()
    try:
        with scratch_dir(path) as scratch:
            measured = measure_in(scratch, base, cfg, use_fio)
    except OSError as exc:  # the scratch directory itself could not be made (EROFS, EACCES, ENOSPC)
        measured = replace(base, error=f"cannot write here: {exc.strerror}")
    return replace(measured, seconds=round(time.monotonic() - start, 3))


def _swept(
    base: LocationFacts, problem: str | None, mount: MountFacts | None, cfg: DiskConfig
) -> tuple[LocationFacts, str | None]:
    """Remove the scratch directories killed runs left; then look at the free space again."""
    swept = sweep_stale(base.path)
    if not swept.paths:
        return base, problem
    free = base.free_bytes
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(base.path).free
    base = replace(base, free_bytes=free, stale_removed=swept.paths, stale_removed_bytes=swept.bytes)
    return base, precondition(base.path, mount, cfg) if problem else None


def measure_disks(cfg: DiskConfig, home: str | None = None, tmp: str | None = None) -> DiskFacts:
    """List the mounts, then measure each candidate location in turn (SIGTERM/SIGHUP clean up like Ctrl-C)."""
    mounts = read_mounts(cfg.stat_timeout_s)
    if not cfg.enabled:
        return DiskFacts(mounts=tuple(mounts), skipped="disabled (preflight.disk.enabled: false)")
    paths = candidates(mounts, cfg, home or os.path.expanduser("~"), tmp or tempfile.gettempdir())
    if not paths:
        return DiskFacts(mounts=tuple(mounts), skipped="no writable location found")
    with terminate_as_interrupt():
        locations = tuple(measure_location(p, explicit, mounts, cfg) for p, explicit in paths)
    return DiskFacts(mounts=tuple(mounts), locations=locations)


def sizes(free: int, cfg: DiskConfig) -> tuple[int, int]:
    """(sequential file cap, sync interval): within max_file_mib and max_free_fraction, whole MiB."""
    cap = min(cfg.max_file_mib * MIB, int(free * cfg.max_free_fraction)) // MIB * MIB
    cap = max(cap, MIB)
    sync = max(CHUNK, min(cfg.sync_mib * MIB, cap // 8) // CHUNK * CHUNK)
    return cap, sync


def sequential(scratch: str, cap: int, sync: int, budget: Budget, use_fio: bool) -> dict[str, object]:
    """Write sequentially, then read back cold, by fio or built in; return the LocationFacts fields."""
    if use_fio:
        result = fio_sequential(scratch, cap, sync // CHUNK, budget.share(0.35), budget.share(0.25))
        if result is not None:
            return {**result, "tool": "fio", "cold_read_method": "fadvise"}
    path = os.path.join(scratch, "sequential.bin")
    written, spent = seq_write(path, cap, budget.share(0.35), sync)
    read, read_s, method = cold_read(path, budget.share(0.25))
    os.unlink(path)
    return {
        "file_bytes": written,
        "seq_write_mb_s": mb_s(written, spent),
        "cold_read_mb_s": mb_s(read, read_s),
        "cold_read_method": method,
        "tool": "builtin",
    }


def checkpoint(
    scratch: str, nbytes: int, free: int, cfg: DiskConfig, budget: Budget, write_mb_s: float | None
) -> dict[str, object]:
    """Write one checkpoint-sized file and fsync it; extrapolate when it does not fit the budget or the disk."""
    predicted = nbytes / (write_mb_s * 1e6) if write_mb_s else None
    fits = nbytes <= free * cfg.max_free_fraction and predicted is not None and predicted <= budget.left()
    if not fits:
        return {
            "checkpoint_bytes": nbytes,
            "checkpoint_write_s": round(predicted, 2) if predicted else None,
            "checkpoint_estimated": True,
        }
    path = os.path.join(scratch, "checkpoint.bin")
    written, spent = seq_write(path, nbytes, float("inf"), nbytes)
    os.unlink(path)
    return {"checkpoint_bytes": written, "checkpoint_write_s": round(spent, 3), "checkpoint_estimated": False}


def measure_in(scratch: str, base: LocationFacts, cfg: DiskConfig, use_fio: bool) -> LocationFacts:
    """All measurements of one location inside ``scratch``; an I/O error stops them and is reported."""
    budget = Budget(cfg.budget_s)
    free = base.free_bytes if base.free_bytes is not None else shutil.disk_usage(scratch).free
    cap, sync = sizes(free, cfg)
    found: dict[str, object] = {}
    try:
        found.update(sequential(scratch, cap, sync, budget, use_fio))
        found.update(small_files(scratch, cfg, budget))
        write = found.get("seq_write_mb_s")
        ckpt = int(cfg.checkpoint_gib * GIB) // MIB * MIB
        found.update(checkpoint(scratch, ckpt, free, cfg, budget, write if isinstance(write, float) else None))
    except MeasureError as exc:
        found["error"] = str(exc)
    return replace(base, **found)  # type: ignore[arg-type]
