"""Disk checks: space on the mounts, speed of each candidate location, and where to put data and checkpoints.

The seed article §3.3: stage training data onto local SSD before training, and keep checkpoints off network
disks (a few-GB save on a slow mount blocks training for seconds to minutes). Figures are MB/s (1e6 bytes).
"""

from __future__ import annotations

from typing import Any

from checks.config import DiskConfig, PreflightConfig
from checks.facts import LocationFacts, MachineFacts, MountFacts
from checks.reports.bootstrap import DiskRow, Mount, row_of
from checks.result import Result, fail, ok, skip, warn
from checks.units import GIB, size_binary


def rate(mb_s: float | None) -> str:
    """452 MB/s, 1.8 GB/s."""
    if mb_s is None:
        return "?"
    return f"{mb_s / 1000:.1f} GB/s" if mb_s >= 1000 else f"{mb_s:.0f} MB/s"


def _free(nbytes: int | None) -> str:
    """Free space in binary units, ``?`` where the mount could not be read."""
    return "?" if nbytes is None else size_binary(nbytes)


def _not_measured(m: MachineFacts, check_id: str) -> Result | None:
    if m.disks is None:
        return skip(check_id, "disks not measured (snapshot recorded without --bench)")
    if check_id == "disk-mounts":
        return None if m.disks.mounts else skip(check_id, m.disks.skipped or "no mount could be read")
    if m.disks.skipped and not m.disks.locations:
        return skip(check_id, m.disks.skipped)
    return None


def _mount_problem(mount: MountFacts, cfg: DiskConfig) -> str | None:
    if mount.error:
        return f"{mount.mountpoint}: {mount.error}"
    if mount.read_only or mount.kind == "memory" or not mount.total_bytes:
        return None
    if (mount.free_bytes or 0) < cfg.free_warn_fraction * mount.total_bytes:
        return f"{mount.mountpoint} is {1 - (mount.free_bytes or 0) / mount.total_bytes:.0%} full"
    if mount.inodes_total and (mount.inodes_free or 0) < cfg.free_warn_fraction * mount.inodes_total:
        return f"{mount.mountpoint} has {mount.inodes_free} of {mount.inodes_total} inodes left"
    return None


def disk_mounts(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Mounted filesystems: type, local or network, free space and inodes.

    Command line equivalent: df -hT; df -i.
    """
    missing = _not_measured(m, "disk-mounts")
    if missing or m.disks is None:
        return [missing or skip("disk-mounts", "not measured")]
    mounts = m.disks.mounts
    listed = ", ".join(f"{x.mountpoint} {x.fs_type} ({x.kind}) {_free(x.free_bytes)} free" for x in mounts)
    value = [
        {"mountpoint": x.mountpoint, "fs_type": x.fs_type, "kind": x.kind, "free_bytes": x.free_bytes} for x in mounts
    ]
    problems = [p for p in (_mount_problem(x, cfg.disk) for x in mounts) if p]
    if problems:
        hint = "free space (or inodes) before staging data: a full disk stops training at the next checkpoint"
        return [warn("disk-mounts", "; ".join(problems), hint, value=value)]
    return [ok("disk-mounts", f"{len(mounts)} filesystems: {listed}", value=value)]


def _speeds(loc: LocationFacts) -> str:
    parts = [
        f"{loc.fs_type} ({loc.kind})",
        f"write {rate(loc.seq_write_mb_s)}",
        f"cold read {rate(loc.cold_read_mb_s)}",
    ]
    if loc.cold_read_method == "warm":
        parts[-1] += " (page cache not dropped: an upper bound)"
    if loc.small_files_per_s is not None:
        parts.append(f"{loc.small_files_per_s:,.0f} small files/s")
    if loc.checkpoint_write_s is not None and loc.checkpoint_bytes:
        how = " (extrapolated)" if loc.checkpoint_estimated else ""
        parts.append(f"{loc.checkpoint_bytes / GIB:.1f} GiB checkpoint in {loc.checkpoint_write_s:.1f} s{how}")
    return ", ".join(parts) + f" [{loc.tool}]"


def _stale_note(loc: LocationFacts) -> str:
    """What a killed earlier run had left here and this one removed first; "" when nothing."""
    if not loc.stale_removed:
        return ""
    count, held = len(loc.stale_removed), loc.stale_removed_bytes
    amount = size_binary(held)
    what = "a scratch directory" if count == 1 else f"{count} scratch directories"
    return f"; removed {what} ({amount}) left by a killed earlier run"


def _location_error(loc: LocationFacts) -> Result:
    text = (loc.error or "") + _stale_note(loc)
    hint = {
        "does not exist": "create it, or fix preflight.disk.locations",
        "disk full": "free space there, or stage data elsewhere",
        "read-only": "mount it read-write, or pick another location",
        "permission": "run as a user who may write there, or pick another location",
    }
    advice = next((h for key, h in hint.items() if key in text), "check the mount (dmesg, mount, df)")
    subject = loc.path
    if loc.explicit or "disk full" in text:
        return fail("disk-speed", f"{loc.path}: {text}", advice, subject=subject)
    return warn("disk-speed", f"{loc.path}: {text}", advice, subject=subject)


def _slow_parts(loc: LocationFacts, cfg: DiskConfig) -> list[str]:
    slow = []
    if loc.cold_read_mb_s is not None and loc.cold_read_mb_s < cfg.read_warn_mb_s:
        slow.append(f"cold read {rate(loc.cold_read_mb_s)} < {rate(cfg.read_warn_mb_s)}")
    if loc.seq_write_mb_s is not None and loc.seq_write_mb_s < cfg.write_warn_mb_s:
        slow.append(f"write {rate(loc.seq_write_mb_s)} < {rate(cfg.write_warn_mb_s)}")
    if loc.small_files_per_s is not None and loc.small_files_per_s < cfg.small_files_warn_per_s:
        slow.append(f"{loc.small_files_per_s:,.0f} small files/s < {cfg.small_files_warn_per_s:,.0f}")
    return slow


def disk_speed(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Judge each location: fsynced sequential write, cold read, small-file reads, a checkpoint-sized write.

    Command line equivalent: fio --rw=write --bs=4M --end_fsync=1, then --rw=read --invalidate=1.
    """
    missing = _not_measured(m, "disk-speed")
    if missing or m.disks is None:
        return [missing or skip("disk-speed", "not measured")]
    out = []
    for loc in m.disks.locations:
        if loc.error and loc.cold_read_mb_s is None:
            out.append(_location_error(loc))
            continue
        slow = _slow_parts(loc, cfg.disk)
        summary = _speeds(loc) + (f"; stopped: {loc.error}" if loc.error else "") + _stale_note(loc)
        if slow or loc.error:
            hint = "keep training data and checkpoints off this location (see disk-data, disk-checkpoint)"
            out.append(warn("disk-speed", summary + "; slow: " + ", ".join(slow), hint, subject=loc.path))
        else:
            out.append(ok("disk-speed", summary, subject=loc.path, value=loc.cold_read_mb_s))
    return out


def _usable(m: MachineFacts) -> list[LocationFacts]:
    return [x for x in (m.disks.locations if m.disks else ()) if x.cold_read_mb_s is not None and not x.error]


def data_score(loc: LocationFacts) -> float:
    """Rate a location for a data loader (MB/s): the slower of the cold sequential read and small-file reads."""
    small = (loc.small_files_per_s or 0) * (loc.small_file_bytes or 0) / 1e6
    return min(loc.cold_read_mb_s or 0.0, small) if small else loc.cold_read_mb_s or 0.0


def pick(locations: list[LocationFacts], room: int, key: Any) -> tuple[LocationFacts | None, bool]:
    """Pick the best location with ``room`` free, off network filesystems when possible; (choice, only_network)."""
    roomy = [x for x in locations if (x.free_bytes or 0) >= room]
    near = [x for x in roomy if x.kind != "network"]
    pool = near or roomy
    if not pool:
        return None, False
    return max(pool, key=key), not near


def _others(chosen: LocationFacts, locations: list[LocationFacts]) -> str:
    rest = [f"{x.path} is {x.fs_type} ({x.kind}) at {rate(x.cold_read_mb_s)}" for x in locations if x is not chosen]
    return ("; " + "; ".join(rest)) if rest else ""


def disk_data(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Name the location to stage training data to: fast cold reads, room, not a network filesystem."""
    missing = _not_measured(m, "disk-data")
    if missing:
        return [missing]
    locations, room = _usable(m), int(cfg.disk.staging_min_free_gib * GIB)
    chosen, only_network = pick(locations, room, data_score)
    if chosen is None:
        return [_no_room("disk-data", locations, room)]
    summary = (
        f"stage data to {chosen.path}: {chosen.fs_type} ({chosen.kind}), {rate(chosen.cold_read_mb_s)} cold read, "
        f"{(chosen.small_files_per_s or 0):,.0f} small files/s, {_free(chosen.free_bytes)} free"
        + _others(chosen, locations)
    )
    return [_data_verdict(chosen, only_network, summary, cfg.disk)]


def _data_verdict(chosen: LocationFacts, only_network: bool, summary: str, cfg: DiskConfig) -> Result:
    value = chosen.path
    if only_network:
        hint = "the only place with room is a network filesystem: add a local disk, or stage a subset"
        return warn("disk-data", summary, hint, value=value)
    read = chosen.cold_read_mb_s or 0.0
    if read < cfg.read_fail_mb_s:
        hint = "no location reads fast enough to feed GPUs: ask for a local NVMe disk (or another box)"
        return fail("disk-data", summary, hint, value=value, expected=f">= {rate(cfg.read_fail_mb_s)}")
    small = chosen.small_files_per_s
    if read < cfg.read_warn_mb_s or (small is not None and small < cfg.small_files_warn_per_s):
        hint = "reads are slow even at the best location: pack small files into shards or pre-decode into one array"
        return warn("disk-data", summary, hint, value=value, expected=f">= {rate(cfg.read_warn_mb_s)}")
    return ok("disk-data", summary, value=value)


def _no_room(check_id: str, locations: list[LocationFacts], room: int) -> Result:
    if not locations:
        return fail(check_id, "no location could be measured (see disk-speed)", "fix the locations listed there")
    biggest = max(locations, key=lambda x: x.free_bytes or 0)
    summary = f"no measured location has {size_binary(room)} free; the most is {biggest.path} with {_free(biggest.free_bytes)}"
    return warn(check_id, summary, "attach or mount a larger local disk", value=biggest.path)


def disk_checkpoint(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Name the location to write checkpoints to: the shortest checkpoint-sized write, off network disks."""
    missing = _not_measured(m, "disk-checkpoint")
    if missing:
        return [missing]
    locations = [x for x in _usable(m) if x.checkpoint_write_s is not None]
    room = 4 * int(cfg.disk.checkpoint_gib * GIB)  # a few checkpoints kept
    chosen, only_network = pick(locations, room, lambda x: -(x.checkpoint_write_s or 0.0))
    if chosen is None:
        return [_no_room("disk-checkpoint", locations, room)]
    how = " (extrapolated from the sequential write)" if chosen.checkpoint_estimated else ""
    summary = (
        f"write checkpoints to {chosen.path}: {chosen.fs_type} ({chosen.kind}), a "
        f"{(chosen.checkpoint_bytes or 0) / GIB:.1f} GiB checkpoint takes {chosen.checkpoint_write_s:.1f} s{how}"
    )
    value, expected = chosen.path, f"<= {cfg.disk.checkpoint_warn_s:g} s"
    if only_network:
        hint = "save to a local disk and upload in the background (the seed article §3.3)"
        return [warn("disk-checkpoint", summary + "; only network filesystems have room", hint, value=value)]
    if (chosen.checkpoint_write_s or 0.0) > cfg.disk.checkpoint_warn_s:
        hint = "each save blocks training this long: save less often, or asynchronously (torch.distributed.checkpoint)"
        return [warn("disk-checkpoint", summary, hint, value=value, expected=expected)]
    return [ok("disk-checkpoint", summary, value=value, expected=expected)]


def disk_measurements(m: MachineFacts) -> tuple[tuple[DiskRow, ...], tuple[Mount, ...]] | None:
    """``measurements.disks`` (one row per measured location) and ``measurements.mounts`` for the report."""
    if m.disks is None:
        return None
    disks = tuple(
        DiskRow(
            path=x.path,
            fs_type=x.fs_type,
            local=x.kind == "local",
            free_bytes=x.free_bytes,
            seq_write_mb_s=x.seq_write_mb_s,
            cold_read_mb_s=x.cold_read_mb_s,
            small_files_per_s=x.small_files_per_s,
            checkpoint_write_s=x.checkpoint_write_s,
            tool=x.tool,
            kind=x.kind,
            cold_read_method=x.cold_read_method,
            file_bytes=x.file_bytes,
            checkpoint_bytes=x.checkpoint_bytes,
            checkpoint_estimated=x.checkpoint_estimated,
            error=x.error,
            stale_removed=tuple(x.stale_removed),
            stale_removed_bytes=x.stale_removed_bytes,
        )
        for x in m.disks.locations
    )
    return disks, tuple(row_of(Mount, x) for x in m.disks.mounts)
