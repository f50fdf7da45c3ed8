"""The probe's one reader of the mount table: parsing mountinfo, filesystem kinds, the mounts that matter, and
the table stage-data's place choice reads."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from checks.facts import MountFacts
from checks.probe.disk import candidates
from checks.probe.mounts import fs_kind, holder, mount_of, mount_table, parse_mountinfo, relevant
from tests.factories import config

MOUNTINFO = r"""22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:22 / /proc rw,nosuid - proc proc rw
27 22 0:40 / /mnt/my\040data rw,relatime - virtiofs share rw
31 22 0:44 / /scratch rw - xfs /dev/nvme0n1 rw
32 22 0:45 / /scratch rw - ext4 /dev/nvme1n1 rw
"""


def test_mount_table_lists_every_mount_under_root_with_the_top_mount_winning(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(MOUNTINFO)
    assert mount_table(tmp_path) == [
        ("/", "ext4"),
        ("/proc", "proc"),
        ("/mnt/my data", "virtiofs"),
        ("/scratch", "ext4"),
    ]


def test_mount_table_is_empty_without_a_readable_mountinfo(tmp_path: Path) -> None:
    assert mount_table(tmp_path) == []


def test_this_machine_has_a_root_mount() -> None:
    assert "/" in {point for point, _ in mount_table()}


KINDS_MOUNTINFO = r"""22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:22 / /proc rw,nosuid - proc proc rw
26 22 0:5 / /dev/shm rw - tmpfs tmpfs rw,size=65536k
27 22 0:40 / /mnt/my\040data rw,relatime - nfs4 10.0.0.9:/export rw,vers=4.2
28 22 0:41 / /mnt/bucket rw - fuse.s3fs s3fs rw
29 22 0:42 / /mnt/local-fuse ro - fuse.mystery x ro
30 22 0:43 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw
31 22 0:44 / /dev/shm rw - tmpfs tmpfs rw,size=1048576k
32 22 0:45 /etc/hosts /etc/hosts rw - ext4 /dev/vda1 rw
"""


def test_mountinfo_parses_escapes_ro_and_keeps_the_top_mount() -> None:
    rows = {m[0]: m for m in parse_mountinfo(KINDS_MOUNTINFO)}
    assert rows["/mnt/my data"] == ("/mnt/my data", "nfs4", "10.0.0.9:/export", False)
    assert rows["/mnt/local-fuse"][3] is True
    assert list(rows).count("/dev/shm") == 1 and list(rows)[-2] == "/dev/shm"


@pytest.mark.parametrize(
    ("fs_type", "kind"),
    [("ext4", "local"), ("xfs", "local"), ("nfs4", "network"), ("lustre", "network"), ("fuse.s3fs", "network"),
     ("fuse.sshfs", "network"), ("fuse.mystery", "fuse"), ("fuseblk", "fuse"), ("overlay", "overlay"),
     ("tmpfs", "memory")],
)  # fmt: skip
def test_filesystem_kinds(fs_type: str, kind: str) -> None:
    assert fs_kind(fs_type) == kind


def test_relevant_mounts_leave_out_pseudo_and_plumbing() -> None:
    kept = [m[0] for m in parse_mountinfo(KINDS_MOUNTINFO) if relevant(m[0], m[1], "/root")]
    assert kept == ["/", "/mnt/my data", "/mnt/bucket", "/mnt/local-fuse", "/dev/shm"]


def test_mount_of_takes_the_longest_prefix() -> None:
    mounts = [MountFacts("/", "ext4"), MountFacts("/mnt/nas", "nfs4", kind="network")]
    assert mount_of("/mnt/nas/x/y", mounts) == mounts[1]
    assert mount_of("/mnt/nasty", mounts) == mounts[0]
    assert mount_of("/x", mounts[1:]) is None


def test_holder_is_the_same_lookup_over_the_mount_table() -> None:
    table = [("/", "overlay"), ("/mnt/nas", "nfs4"), ("/mnt/nas", "ext4")]
    assert holder("/mnt/nas/x", table) == ("/mnt/nas", "ext4")  # the later mount over the point wins
    assert holder("/mnt/nasty", table) == ("/", "overlay")
    assert holder("/x", []) == ("", "unknown")


def test_candidates_one_per_filesystem_and_listed_ones_first(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    cfg = config().disk
    found = candidates([], cfg, str(a), str(b))
    assert found == [(str(a), False)]  # same filesystem: measured once
    listed = replace(cfg, locations=("~/x", str(a), str(a)))
    assert candidates([], listed, str(a), str(b)) == [(os.path.expanduser("~/x"), True), (str(a), True)]
