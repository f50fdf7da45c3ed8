"""The mount table that stage-data's place choice reads through the probe (one reader of mountinfo)."""

from __future__ import annotations

from pathlib import Path

from checks.probe.mounts import mount_table

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
