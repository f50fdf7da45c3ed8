"""Where a staged dataset goes, and whether it fits there.

Without ``--dest``, the dataset goes under the configured root with the most free space that is a local disk:
network filesystems (NFS, SMB, Lustre, ...), FUSE mounts (s3fs, gcsfuse, rclone, sshfs) and RAM (tmpfs) are
left out, and an overlay (a container's own root) only counts when nothing better is there
(ref/data-staging.md §6.3). This is the fallback; a measured disk choice from bootstrap's disk checks plugs in
as ``choose_root``'s ``ranked`` argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from datasets.errors import StageFailure

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "beegfs", "gpfs", "afs", "davfs"}
)
RAM_FS = frozenset({"tmpfs", "ramfs"})
GIB = 1024**3


@dataclass(frozen=True)
class Place:
    """A candidate root folder and the filesystem it lives on."""

    path: Path
    fstype: str
    free: int  # bytes this user may still write
    device: int

    @property
    def local(self) -> bool:
        return not (self.fstype in NETWORK_FS or self.fstype in RAM_FS or self.fstype.startswith("fuse"))

    def describe(self) -> str:
        """Name the place for messages: path, filesystem type, free space."""
        return f"{self.path} ({self.fstype}, {gib(self.free)} free)"


def gib(n: float) -> str:
    """Format a byte count for people: MiB below a GiB, GiB above."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def mounts(root: Path = Path("/")) -> list[tuple[str, str]]:
    """Return (mount point, filesystem type) pairs. Command line equivalent: findmnt -o TARGET,FSTYPE"""
    try:
        text = (root / "proc" / "self" / "mountinfo").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and right:
            found.append((fields[4].replace("\\040", " "), right.split()[0]))
    return found


def fstype_of(path: Path, table: list[tuple[str, str]]) -> str:
    """Return the type of the filesystem holding ``path`` (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    for point, fstype in table:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def existing_ancestor(path: Path) -> Path:
    """Return ``path`` or its nearest parent that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def place_of(path: Path, table: list[tuple[str, str]] | None = None) -> Place:
    """Describe the filesystem that ``path`` (or its nearest existing parent) is on."""
    anchor = existing_ancestor(path)
    st = os.statvfs(anchor)
    return Place(
        path, fstype_of(anchor, mounts() if table is None else table), st.f_frsize * st.f_bavail, os.stat(anchor).st_dev
    )


def candidates(roots: list[str], table: list[tuple[str, str]] | None = None) -> list[Place]:
    """Return the configured roots that exist and are writable, one per filesystem (the first listed)."""
    table = mounts() if table is None else table
    found: dict[int, Place] = {}
    for raw in roots:
        path = Path(os.path.expanduser(raw))
        if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
            place = place_of(path, table)
            found.setdefault(place.device, place)
    return list(found.values())


def choose_root(places: list[Place]) -> Place | None:
    """Pick the local non-overlay place with the most free space; an overlay only when it is all there is."""
    local = [p for p in places if p.local]
    better = [p for p in local if p.fstype != "overlay"] or local
    return max(better, key=lambda p: p.free, default=None)


def check_space(where: Path, name: str, needed: int, what: str, alternatives: list[Place], smaller: str = "") -> None:
    """Raise StageFailure (exit 1) naming the numbers and the alternatives when ``needed`` bytes do not fit."""
    place = place_of(where)
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
        f"not enough free space at {existing_ancestor(where)} ({place.fstype}): {what} need {gib(needed)}, "
        f"{gib(place.free)} free",
        hint="alternatives: " + "; ".join(options) if options else "free some space or pick another --dest",
    )
