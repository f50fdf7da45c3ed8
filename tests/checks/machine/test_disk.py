"""Disk checks as pure judgements over facts, and the mount table parsing behind them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checks.facts import DiskFacts, LocationFacts, MachineFacts, MountFacts
from checks.machine.disk import disk_checkpoint, disk_data, disk_measurements, disk_mounts, disk_speed
from checks.result import Result, Status
from tests.factories import config, machine

GIB = 1024**3
LOCAL = LocationFacts(
    "/root/data-disk", mountpoint="/root/data-disk", fs_type="ext4", kind="local", free_bytes=1500 * GIB,
    seq_write_mb_s=1800.0, cold_read_mb_s=2100.0, cold_read_method="fadvise", small_files_per_s=9800.0,
    small_file_bytes=102400, small_files=2000, checkpoint_bytes=2 * GIB, checkpoint_write_s=1.3,
)  # fmt: skip
NAS = replace(LOCAL, path="/mnt/nas", mountpoint="/mnt/nas", fs_type="nfs4", kind="network", free_bytes=8000 * GIB,
              seq_write_mb_s=95.0, cold_read_mb_s=110.0, small_files_per_s=420.0, checkpoint_write_s=22.6)  # fmt: skip
SMALL_ROOT = replace(LOCAL, path="/root", mountpoint="/", fs_type="overlay", kind="overlay", free_bytes=20 * GIB)


def facts(*locations: LocationFacts, mounts: tuple[MountFacts, ...] = ()) -> MachineFacts:
    return machine(disks=DiskFacts(mounts=mounts, locations=locations))


def one(results: list, check_id: str, subject: str | None = None) -> Result:
    found = [r for r in results if r.id == check_id and r.subject == subject]
    assert len(found) == 1, results
    return found[0]


def test_issue_example_stages_to_local_nvme_and_names_the_nfs_mount() -> None:
    r = one(disk_data(facts(LOCAL, NAS), config()), "disk-data")
    assert r.status is Status.OK and r.value == "/root/data-disk"
    assert "stage data to /root/data-disk: ext4 (local), 2.1 GB/s cold read" in r.summary
    assert "/mnt/nas is nfs4 (network) at 110 MB/s" in r.summary


def test_only_room_on_a_network_filesystem_warns() -> None:
    r = one(disk_data(facts(SMALL_ROOT, NAS), config()), "disk-data")
    assert r.status is Status.WARN and r.value == "/mnt/nas" and "network" in (r.hint or "")


def test_too_slow_everywhere_fails_and_nothing_roomy_warns() -> None:
    slow = replace(LOCAL, cold_read_mb_s=60.0)
    assert one(disk_data(facts(slow), config()), "disk-data").status is Status.FAIL
    tiny = one(disk_data(facts(SMALL_ROOT), config()), "disk-data")
    assert tiny.status is Status.WARN and "no measured location has 50.0 GiB free" in tiny.summary


def test_small_file_rate_decides_the_data_location() -> None:
    fast_big_files = replace(LOCAL, path="/a", small_files_per_s=300.0)
    balanced = replace(LOCAL, path="/b", cold_read_mb_s=900.0)
    assert one(disk_data(facts(fast_big_files, balanced), config()), "disk-data").value == "/b"


def test_checkpoint_location_and_slow_save() -> None:
    r = one(disk_checkpoint(facts(LOCAL, NAS), config()), "disk-checkpoint")
    assert r.status is Status.OK and r.value == "/root/data-disk" and "2.0 GiB checkpoint takes 1.3 s" in r.summary
    slow = replace(LOCAL, checkpoint_write_s=45.0, checkpoint_estimated=True)
    warned = one(disk_checkpoint(facts(slow), config()), "disk-checkpoint")
    assert warned.status is Status.WARN and "extrapolated" in warned.summary
    assert one(disk_checkpoint(facts(SMALL_ROOT, NAS), config()), "disk-checkpoint").value == "/root"


@pytest.mark.parametrize(
    ("location", "status", "needle"),
    [
        (LocationFacts("/data", explicit=True, error="does not exist"), Status.FAIL, "create it"),
        (
            LocationFacts("/ro", explicit=True, error="read-only filesystem (/ro is mounted ro)"),
            Status.FAIL,
            "read-write",
        ),
        (
            LocationFacts("/x", error="disk full while writing the test file (12 MiB written)"),
            Status.FAIL,
            "free space",
        ),
        (LocationFacts("/y", error="not writable by this user (permission denied)"), Status.WARN, "user who may write"),
    ],
)
def test_locations_that_cannot_be_measured(location: LocationFacts, status: Status, needle: str) -> None:
    r = one(disk_speed(facts(location), config()), "disk-speed", location.path)
    assert r.status is status and needle in (r.hint or ""), r


def test_speed_summary_names_tool_method_and_slow_parts() -> None:
    ok = one(disk_speed(facts(LOCAL), config()), "disk-speed", LOCAL.path)
    assert ok.status is Status.OK and ok.summary.endswith("[builtin]")
    warm = one(disk_speed(facts(replace(NAS, cold_read_method="warm", tool="fio")), config()), "disk-speed", NAS.path)
    assert warm.status is Status.WARN and "upper bound" in warm.summary and "[fio]" in warm.summary
    assert "cold read 110 MB/s < 500 MB/s" in warm.summary and "420 small files/s < 2,000" in warm.summary


def test_removed_leftovers_of_a_killed_run_are_named() -> None:
    swept = replace(LOCAL, stale_removed=("/root/data-disk/.gpu-preflight-disk-x",), stale_removed_bytes=3 * GIB)
    r = one(disk_speed(facts(swept), config()), "disk-speed", LOCAL.path)
    assert r.status is Status.OK and r.summary.endswith(
        "; removed a scratch directory (3.0 GiB) left by a killed earlier run"
    )
    failed = replace(swept, error="disk full: 10 MiB free", cold_read_mb_s=None, stale_removed=("a", "b"))
    assert (
        "removed 2 scratch directories (3.0 GiB)"
        in one(disk_speed(facts(failed), config()), "disk-speed", LOCAL.path).summary
    )
    measured = disk_measurements(facts(swept))
    assert measured is not None and measured[0][0].stale_removed_bytes == 3 * GIB


def test_full_or_hung_mounts_warn() -> None:
    full = MountFacts("/", "ext4", total_bytes=100 * GIB, free_bytes=2 * GIB, inodes_total=1000, inodes_free=900)
    hung = MountFacts("/mnt/nas", "nfs4", kind="network", error="statvfs no answer within 2 s (a dead network mount?)")
    r = one(disk_mounts(facts(mounts=(full, hung)), config()), "disk-mounts")
    assert r.status is Status.WARN and "/ is 98% full" in r.summary and "dead network mount" in r.summary
    inodes = replace(full, free_bytes=50 * GIB, inodes_free=10)
    assert "inodes left" in one(disk_mounts(facts(mounts=(inodes,)), config()), "disk-mounts").summary


def test_not_measured_and_replayed_skip() -> None:
    plain = machine()
    for check in (disk_mounts, disk_speed, disk_data, disk_checkpoint):
        assert all(r.status is Status.SKIP for r in check(plain, config()))
    replayed = machine(disks=DiskFacts(skipped="replayed snapshot: disk measurements need the live machine"))
    assert one(disk_data(replayed, config()), "disk-data").summary.startswith("replayed snapshot")


def test_measurements_have_the_documented_keys() -> None:
    out = disk_measurements(facts(LOCAL, NAS))
    assert out is not None
    disks, _ = out
    required = {"path", "fs_type", "local", "free_bytes", "seq_write_mb_s", "cold_read_mb_s", "small_files_per_s",
                "checkpoint_write_s", "tool"}  # fmt: skip
    assert all(required <= set(row.to_json()) for row in disks)
    assert [row.local for row in disks] == [True, False]
