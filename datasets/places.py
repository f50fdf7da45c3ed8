"""Where a staged dataset goes, and whether it fits there.

Without ``--dest``, the dataset goes under one of the configured roots (``preflight.stage.dest_roots``), one per
filesystem. Only local disks count: network filesystems (NFS, SMB, Lustre, virtiofs, ...), FUSE mounts (s3fs,
gcsfuse, rclone, sshfs) and RAM (tmpfs) are left out, and an overlay (a container's own root) only counts when
nothing better is there (docs/sources.md#staging-disk-choice); the mount table, the kinds and the timeout on
statvfs (a dead network mount hangs it) are bootstrap's (checks/probe/mounts.py). Among those with room, the one
that reads fastest for a data loader wins, measured by bootstrap's disk checks (checks/probe/disk_cache.py) or,
when bootstrap has not measured it since this boot, measured now (checks/probe/disk.py, a few seconds per disk).
A root that already holds this dataset (staged, or an unfinished run) is kept, so a re-run is a no-op or a resume
wherever the disk speeds now rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from checks.facts import LocationFacts
from checks.machine.disk import data_score, rate
from checks.probe.mounts import STAT_TIMEOUT_S, fs_kind, holder, mount_table, with_timeout
from checks.units import size_binary
from datasets.errors import StageFailure


@dataclass(frozen=True)
class Place:
    """A candidate root folder and the filesystem it lives on."""

    path: Path
    fstype: str
    free: int  # bytes this user may still write
    device: int

    @property
    def kind(self) -> str:
        """local, network, fuse, overlay or memory (bootstrap's classification)."""
        return fs_kind(self.fstype)

    @property
    def local(self) -> bool:
        """On a disk of this machine: a local filesystem or a container's overlay."""
        return self.kind in ("local", "overlay")

    def describe(self) -> str:
        """Name the place for messages: path, filesystem type, free space."""
        return f"{self.path} ({self.fstype}, {size_binary(self.free)} free)"


def mount_point(path: Path, table: list[tuple[str, str]]) -> str:
    """Return the mount point of the filesystem holding ``path`` ("" when the table has none above it)."""
    return holder(path, table)[0]


def existing_ancestor(path: Path) -> Path:
    """Return ``path`` or its nearest parent that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_place(path: Path, table: list[tuple[str, str]]) -> Place:
    anchor = existing_ancestor(path)
    st = os.statvfs(anchor)
    return Place(
        path=path, fstype=holder(anchor, table)[1], free=st.f_frsize * st.f_bavail, device=os.stat(anchor).st_dev
    )


def place_of(path: Path, table: list[tuple[str, str]] | None = None, stat_timeout_s: float = STAT_TIMEOUT_S) -> Place:
    """Describe the filesystem that ``path`` (or its nearest existing parent) is on, within ``stat_timeout_s``
    (bootstrap's ``preflight.disk.stat_timeout_s``): a dead network mount hangs statvfs, and is a StageFailure."""
    table = mount_table() if table is None else table
    try:
        return with_timeout(lambda: _read_place(path, table), stat_timeout_s)
    except TimeoutError as exc:
        raise StageFailure(
            f"{path}: statvfs {exc} (a dead network mount?)",
            hint="check the mount (mount, dmesg) or pick another --dest",
        ) from None


def _writable_place(path: Path, table: list[tuple[str, str]]) -> Place | None:
    return _read_place(path, table) if path.is_dir() and os.access(path, os.W_OK | os.X_OK) else None


def candidates(
    roots: list[str], table: list[tuple[str, str]] | None = None, stat_timeout_s: float = STAT_TIMEOUT_S
) -> list[Place]:
    """Return the configured roots that exist and are writable, one per filesystem (the first listed); a root
    that does not answer within ``stat_timeout_s`` (a dead network mount) is left out, as bootstrap leaves it."""
    table = mount_table() if table is None else table
    found: dict[int, Place] = {}
    for raw in roots:
        path = Path(os.path.expanduser(raw))
        try:
            place = with_timeout(partial(_writable_place, path, table), stat_timeout_s)
        except TimeoutError:
            continue
        if place is not None:
            found.setdefault(place.device, place)
    return list(found.values())


@dataclass(frozen=True)
class Choice:
    """The root picked, and one line saying why (shown before any work starts)."""

    place: Place
    why: str


Measure = Callable[[Place], LocationFacts]


def choose_root(
    places: list[Place],
    name: str,
    need: int = 0,
    measured: list[LocationFacts] | None = None,
    measure: Measure | None = None,
    measured_when: str = "measured by bootstrap",
    table: list[tuple[str, str]] | None = None,
) -> Choice | None:
    """Pick the root for dataset ``name`` needing ``need`` bytes; None when no local disk is configured.

    ``measured``: locations bootstrap measured (matched to a place by mount point); ``measure``: measures a
    place now (None: rank by free space only, as without any measurement).
    """
    local = [p for p in places if p.local]
    pool = [p for p in local if p.kind != "overlay"] or local
    if not pool:
        return None
    for place in pool:
        folder = place.path / "staged"
        if (folder / name).is_dir() or (folder / f".{name}.staging").is_dir():
            return Choice(place, f"staging to {place.path}: it already holds {name} (staged or unfinished)")
    roomy = [p for p in pool if p.free >= need] or [max(pool, key=lambda p: p.free)]  # check_space says the rest
    if len(roomy) == 1:
        only = roomy[0]
        return Choice(only, f"staging to {only.describe()}: the only local disk with room among the configured roots")
    if measure is None and not measured:
        best = max(roomy, key=lambda p: p.free)
        return Choice(best, f"staging to {best.describe()}: the most free space (disk speeds not measured)")
    table = mount_table() if table is None else table
    ranked = [(p, _speed_of(p, measured or [], measure, measured_when, table)) for p in roomy]
    best_place, (best_loc, how) = max(ranked, key=lambda pr: (data_score(pr[1][0]), pr[0].free))
    others = "; ".join(f"{p.path} {_speed(loc)} ({h})" for p, (loc, h) in ranked if p is not best_place)
    return Choice(
        best_place, f"staging to {best_place.describe()}: {_speed(best_loc)} ({how}), the fastest of: {others}"
    )


def _speed_of(
    place: Place,
    measured: list[LocationFacts],
    measure: Measure | None,
    measured_when: str,
    table: list[tuple[str, str]],
) -> tuple[LocationFacts, str]:
    """The place's measurement: bootstrap's for the same mount point, else a fresh one (else an empty one)."""
    point = mount_point(place.path, table)
    for loc in measured:
        if loc.mountpoint and loc.mountpoint == point and loc.cold_read_mb_s is not None:
            return loc, measured_when
    if measure is None:
        return LocationFacts(path=str(place.path), error="not measured"), "not measured"
    loc = measure(place)
    return loc, "measured now" if loc.error is None else f"not measured: {loc.error}"


def _speed(loc: LocationFacts) -> str:
    if loc.cold_read_mb_s is None:
        return "speed unknown"
    small = f", {loc.small_files_per_s:,.0f} small files/s" if loc.small_files_per_s else ""
    return f"{rate(loc.cold_read_mb_s)} cold read{small}"


def check_space(
    where: Path,
    name: str,
    needed: int,
    what: str,
    alternatives: list[Place],
    smaller: str = "",
    stat_timeout_s: float = STAT_TIMEOUT_S,
) -> None:
    """Raise StageFailure (exit 1) naming the numbers and the alternatives when ``needed`` bytes do not fit."""
    place = place_of(where, stat_timeout_s=stat_timeout_s)
    if needed <= place.free:
        return
    here = place.device
    others = [
        f"{p.describe()}: --dest {p.path / 'staged' / name}"
        for p in alternatives
        if p.free >= needed and p.device != here
    ]
    options = others + ([smaller] if smaller else [])
    raise StageFailure(
        f"not enough free space at {existing_ancestor(where)} ({place.fstype}): {what} need {size_binary(needed)}, "
        f"{size_binary(place.free)} free",
        hint="alternatives: " + "; ".join(options) if options else "free some space or pick another --dest",
    )
