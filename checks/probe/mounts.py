"""Mounted filesystems: which matter for data and checkpoints, what kind they are, and their space.

Read from ``/proc/self/mountinfo`` (the mounts this process sees, containers included) with ``statvfs`` for
space and inodes; a dead network mount can hang ``statvfs``, so each call gets a timeout.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from checks.facts import MountFacts

T = TypeVar("T")
STAT_TIMEOUT_S = 2.0  # preflight.disk.stat_timeout_s's default, for callers without the config

# Filesystems that hold no data of their own (kernel interfaces, container plumbing, read-only images).
PSEUDO_FS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs", "pstore", "bpf",
    "mqueue", "hugetlbfs", "configfs", "fusectl", "binfmt_misc", "autofs", "rpc_pipefs", "nsfs", "efivarfs",
    "selinuxfs", "squashfs", "iso9660", "nfsd", "fuse.lxcfs", "fuse.portal", "fuse.gvfsd-fuse", "overlayfs-meta",
})  # fmt: skip
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p", "afs", "ncpfs",
    "wekafs", "panfs", "pvfs2", "orangefs", "virtiofs", "davfs", "quobyte",
})  # fmt: skip
# FUSE filesystems whose data lives across the network (object stores, remote shells, distributed stores).
NETWORK_FUSE = frozenset({
    "sshfs", "s3fs", "gcsfuse", "juicefs", "rclone", "goofys", "mountpoint-s3", "blobfuse", "blobfuse2", "cephfs",
    "glusterfs", "alluxio-fuse", "geesefs", "ossfs", "cosfs", "jfs", "seaweedfs", "moosefs", "lizardfs",
})  # fmt: skip
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
SYSTEM_PREFIXES = (
    "/proc", "/sys", "/dev", "/run", "/boot", "/snap", "/var/lib/docker", "/var/lib/containerd", "/var/lib/kubelet", "/etc",
)  # fmt: skip
KEPT_MEMORY = ("/dev/shm", "/tmp", "/var/tmp")


def fs_kind(fs_type: str) -> str:
    """Classify a filesystem type: local, network, fuse, overlay or memory."""
    if fs_type in MEMORY_FS:
        return "memory"
    if fs_type in NETWORK_FS:
        return "network"
    if fs_type.startswith("fuse."):
        return "network" if fs_type.removeprefix("fuse.") in NETWORK_FUSE else "fuse"
    if fs_type in ("fuse", "fuseblk"):
        return "fuse"
    if fs_type in ("overlay", "aufs"):
        return "overlay"
    return "local"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[str, str, str, bool]]:
    """Return (mountpoint, fs_type, source, read_only) per line; a later mount over the same point wins."""
    found: dict[str, tuple[str, str, str, bool]] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        mountpoint = _unescape(fields[4])
        read_only = "ro" in fields[5].split(",")
        found.pop(mountpoint, None)
        found[mountpoint] = (mountpoint, tail[0], _unescape(tail[1]), read_only)
    return list(found.values())


def relevant(mountpoint: str, fs_type: str, home: str) -> bool:
    """Keep mounts that can hold data or checkpoints: no pseudo filesystems, no system plumbing."""
    if fs_type in PSEUDO_FS:
        return False
    kind = fs_kind(fs_type)
    under_home = mountpoint == home or mountpoint.startswith(home.rstrip("/") + "/")
    if kind == "memory":
        return mountpoint in KEPT_MEMORY or under_home
    return not any(mountpoint == p or mountpoint.startswith(p + "/") for p in SYSTEM_PREFIXES)


def with_timeout(fn: Callable[[], T], seconds: float) -> T:
    """Run ``fn`` in a daemon thread; raise TimeoutError when it has not answered within ``seconds``."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if errors:
        raise errors[0]
    if not box:
        raise TimeoutError(f"no answer within {seconds:g} s")
    return box[0]


def mount_facts(entry: tuple[str, str, str, bool], stat_timeout_s: float) -> MountFacts:
    """Read space and inodes of one mount (statvfs, bounded: a dead NFS server hangs it)."""
    mountpoint, fs_type, source, read_only = entry
    base = MountFacts(mountpoint, fs_type, source, fs_kind(fs_type), read_only)
    try:
        st = statvfs(mountpoint, stat_timeout_s)
    except TimeoutError as exc:
        return replace(base, error=f"statvfs {exc} (a dead network mount?)")
    except OSError as exc:
        return replace(base, error=f"statvfs: {exc.strerror}")
    return replace(
        base,
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=st.f_bavail * st.f_frsize,
        inodes_total=st.f_files or None,
        inodes_free=st.f_favail if st.f_files else None,
    )


def _mountinfo(root: Path) -> list[tuple[str, str, str, bool]]:
    """Parse ``/proc/self/mountinfo`` under ``root``; no mounts when it cannot be read."""
    try:
        text = (root / "proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_mountinfo(text)


def mount_table(root: Path = Path("/")) -> list[tuple[str, str]]:
    """Return (mountpoint, fs_type) of every mount this process sees, without touching the filesystems.

    Command line equivalent: findmnt --list --output TARGET,FSTYPE
    """
    return [(mountpoint, fs_type) for mountpoint, fs_type, _, _ in _mountinfo(root)]


def read_mounts(
    stat_timeout_s: float = STAT_TIMEOUT_S, root: Path = Path("/"), home: str | None = None
) -> list[MountFacts]:
    """List the relevant mounts this process sees, in mount order."""
    home = home or os.path.expanduser("~")
    entries = [e for e in _mountinfo(root) if relevant(e[0], e[1], home) and _is_dir(root, e[0])]
    return [mount_facts(e, stat_timeout_s) for e in entries]


def _is_dir(root: Path, mountpoint: str) -> bool:
    """Docker bind-mounts files (/etc/hosts); only directories can hold data."""
    return (root / mountpoint.lstrip("/")).is_dir()


def _longest(path: str | os.PathLike[str], points: Iterable[str]) -> int | None:
    """The position of the mount point ``path`` lives under: the longest that is a prefix of its real path (a
    later mount over the same point wins, as in the mount table); None when none is."""
    real = os.path.realpath(path)
    best, length = None, -1
    for i, point in enumerate(points):
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= length:
            best, length = i, len(point)
    return best


def mount_of(path: str, mounts: Iterable[MountFacts]) -> MountFacts | None:
    """Find the mount a path lives on: the longest mountpoint that is a prefix of its real path."""
    listed = list(mounts)
    found = _longest(path, (m.mountpoint for m in listed))
    return None if found is None else listed[found]


def holder(path: str | os.PathLike[str], table: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """Return (mount point, type) of the filesystem holding ``path`` in a ``mount_table()``; ("", "unknown") when
    the table has no mount point above it."""
    listed = list(table)
    found = _longest(path, (point for point, _ in listed))
    return ("", "unknown") if found is None else listed[found]


def statvfs(path: str | os.PathLike[str], timeout_s: float) -> os.statvfs_result:
    """``os.statvfs`` bounded by ``timeout_s`` (TimeoutError "no answer within N s"): a dead NFS server hangs it."""
    return with_timeout(lambda: os.statvfs(path), timeout_s)
