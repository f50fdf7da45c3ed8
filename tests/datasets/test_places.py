"""Where stage-data puts a dataset without --dest: local disks only, the fastest-reading one with room."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.facts import LocationFacts
from checks.probe.mounts import fs_kind
from datasets.errors import StageFailure
from datasets.places import Place, candidates, choose_root, mount_point, place_of
from datasets.stage import _measurer, stage
from tests.datasets import jobs
from tests.factories import config

GIB = 1024**3
TABLE = [("/", "overlay"), ("/scratch", "ext4"), ("/data", "xfs"), ("/mnt/nas", "nfs4")]


def place(root: Path, sub: str, fstype: str, free_gib: float, device: int) -> Place:
    path = root / sub
    path.mkdir(exist_ok=True)
    return Place(path, fstype, int(free_gib * GIB), device)


class Speeds:
    """A measure() for the test places: cold read by folder name, 50,000 small files/s of 100 KB each."""

    def __init__(self, **mb_s: float) -> None:
        self.mb_s, self.calls = mb_s, list[str]()

    def __call__(self, p: Place) -> LocationFacts:
        self.calls.append(p.path.name)
        return LocationFacts(
            path=str(p.path),
            cold_read_mb_s=self.mb_s[p.path.name],
            small_files_per_s=50_000.0,
            small_file_bytes=100_000,
        )


def test_the_fastest_reader_with_room_wins_over_the_roomiest(tmp_path: Path) -> None:
    big_slow, small_fast = place(tmp_path, "big", "ext4", 900, 1), place(tmp_path, "fast", "xfs", 100, 2)
    measure = Speeds(big=300.0, fast=2100.0)
    choice = choose_root([big_slow, small_fast], "imgs-256px", 50 * GIB, measure=measure, table=[])
    assert choice is not None and choice.place is small_fast
    assert "2.1 GB/s cold read, 50,000 small files/s (measured now), the fastest of:" in choice.why
    assert "big 300 MB/s cold read" in choice.why
    # Without room the fast one is out; the slow one is the only choice and nothing is measured.
    measure = Speeds(big=300.0, fast=2100.0)
    choice = choose_root([big_slow, small_fast], "imgs-256px", 200 * GIB, measure=measure, table=[])
    assert choice is not None and choice.place is big_slow and "the only local disk with room" in choice.why
    assert measure.calls == []


def test_small_file_rate_limits_the_score_like_disk_data(tmp_path: Path) -> None:
    a, b = place(tmp_path, "a", "ext4", 100, 1), place(tmp_path, "b", "ext4", 100, 2)

    def measure(p: Place) -> LocationFacts:  # a reads 3 GB/s sequentially but only 100 small files/s
        small = {"a": 100.0, "b": 5000.0}[p.path.name]
        return LocationFacts(
            path=str(p.path), cold_read_mb_s=3000.0 if p.path.name == "a" else 900.0, small_files_per_s=small,
            small_file_bytes=100_000,
        )  # fmt: skip

    choice = choose_root([a, b], "x", measure=measure, table=[])
    assert choice is not None and choice.place is b


def test_bootstraps_figures_are_used_by_mount_point_before_measuring(tmp_path: Path) -> None:
    scratch = Place(tmp_path / "s", "ext4", 500 * GIB, 1)
    data = Place(tmp_path / "d", "xfs", 500 * GIB, 2)
    table = [("/", "overlay"), (str(scratch.path), "ext4"), (str(data.path), "xfs")]
    kept = [
        LocationFacts(path=str(scratch.path / "x"), mountpoint=str(scratch.path), cold_read_mb_s=1800.0),
        LocationFacts(path="/elsewhere", mountpoint="/elsewhere", cold_read_mb_s=9000.0),  # not a candidate
    ]
    measure = Speeds(d=700.0)
    choice = choose_root(
        [scratch, data], "x", measured=kept, measure=measure, measured_when="by bootstrap 5 min ago", table=table
    )
    assert choice is not None and choice.place is scratch
    assert "(by bootstrap 5 min ago)" in choice.why and "(measured now)" in choice.why
    assert measure.calls == ["d"]  # only the root bootstrap had not measured


def test_a_root_already_holding_the_dataset_is_kept(tmp_path: Path) -> None:
    slow, fast = place(tmp_path, "slow", "ext4", 100, 1), place(tmp_path, "fast", "ext4", 100, 2)
    (slow.path / "staged" / ".imgs-64px.staging").mkdir(parents=True)  # an unfinished run: resume it there
    measure = Speeds(slow=100.0, fast=3000.0)
    choice = choose_root([slow, fast], "imgs-64px", measure=measure, table=[])
    assert choice is not None and choice.place is slow and "already holds imgs-64px" in choice.why
    assert measure.calls == []


def test_network_ram_and_fuse_never_count_and_overlay_only_alone(tmp_path: Path) -> None:
    nas, shm = place(tmp_path, "nas", "nfs4", 9000, 1), place(tmp_path, "shm", "tmpfs", 9000, 2)
    fuse, overlay = place(tmp_path, "fuse", "fuse.s3fs", 9000, 3), place(tmp_path, "ov", "overlay", 50, 4)
    assert choose_root([nas, shm, fuse], "x", table=[]) is None
    only = choose_root([nas, shm, fuse, overlay], "x", table=[])
    assert only is not None and only.place is overlay
    disk = place(tmp_path, "disk", "ext4", 10, 5)
    choice = choose_root([overlay, disk], "x", measure=Speeds(ov=5000.0, disk=100.0), table=[])
    assert choice is not None and choice.place is disk  # a real disk beats the container's overlay


def test_without_any_measurement_the_most_free_space_wins(tmp_path: Path) -> None:
    a, b = place(tmp_path, "a", "ext4", 10, 1), place(tmp_path, "b", "ext4", 20, 2)
    choice = choose_root([a, b], "x", table=[])
    assert choice is not None and choice.place is b and "disk speeds not measured" in choice.why


def test_mount_point_is_the_longest_one_above() -> None:
    assert mount_point(Path("/scratch/ds/x"), TABLE) == "/scratch"
    assert mount_point(Path("/scratchy"), TABLE) == "/"
    assert mount_point(Path("/x"), []) == ""


@pytest.mark.slow
def test_measuring_a_root_now_is_a_real_disk_measurement(tmp_path: Path) -> None:
    cfg = config(disk={"budget_s": 1.0, "max_file_mib": 16, "use_fio": False}).disk
    measure = _measurer(cfg)
    assert measure is not None
    loc = measure(Place(tmp_path, "ext4", 10 * GIB, 1))
    assert loc.error is None and loc.cold_read_mb_s and loc.cold_read_mb_s > 0
    assert loc.small_files_per_s and loc.small_files_per_s > 0
    assert [p.name for p in tmp_path.iterdir()] == []  # its test files are gone


@pytest.mark.parametrize("fstype", ["virtiofs", "wekafs", "quobyte", "nfs4", "fuse.sshfs", "tmpfs"])
def test_a_place_is_local_exactly_when_bootstrap_calls_its_filesystem_local(tmp_path: Path, fstype: str) -> None:
    shared, disk = place(tmp_path, "shared", fstype, 9000, 1), place(tmp_path, "disk", "ext4", 10, 2)
    assert not shared.local and shared.kind == fs_kind(fstype)
    choice = choose_root([shared, disk], "x", table=[])
    assert choice is not None and choice.place is disk
    assert choose_root([shared], "x", table=[]) is None


def test_the_place_of_a_folder_on_virtiofs_is_not_local(tmp_path: Path) -> None:
    table = [("/", "ext4"), (str(tmp_path), "virtiofs")]
    assert place_of(tmp_path / "sub", table).fstype == "virtiofs" and not place_of(tmp_path, table).local


@pytest.fixture
def dead_mount(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """statvfs of the folders put in the yielded set hangs, as on an NFS mount whose server is gone."""
    dead, gone, real = set[str](), threading.Event(), os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        if os.fspath(path) in dead:
            gone.wait(60)  # the test's end lets the stuck thread go
        return real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)
    yield dead
    gone.set()


def test_a_dead_mount_is_cut_off_by_the_probe_timeout_not_waited_for(tmp_path: Path, dead_mount: set[str]) -> None:
    dead_mount.add(str(tmp_path))
    start = time.monotonic()
    with pytest.raises(StageFailure, match=r"statvfs no answer within 0.2 s \(a dead network mount\?\)"):
        place_of(tmp_path / "ds", [("/", "ext4")], stat_timeout_s=0.2)
    assert time.monotonic() - start < 5


def test_a_dead_root_is_left_out_of_the_candidates_and_the_live_one_kept(tmp_path: Path, dead_mount: set[str]) -> None:
    for name in ("nas", "disk"):
        (tmp_path / name).mkdir()
    dead_mount.add(str(tmp_path / "nas"))
    start = time.monotonic()
    found = candidates([str(tmp_path / "nas"), str(tmp_path / "disk")], [("/", "ext4")], stat_timeout_s=0.2)
    assert [p.path.name for p in found] == ["disk"] and time.monotonic() - start < 5


def test_stage_data_onto_a_dead_mount_fails_within_bootstraps_timeout(tmp_path: Path, dead_mount: set[str]) -> None:
    """The whole stage-data path, with --dest on the dead mount and preflight.disk.stat_timeout_s at 0.3 s."""
    for name in ("src", "nas"):
        (tmp_path / name).mkdir()
    (tmp_path / "src" / "a.txt").write_text("a line of text\n", encoding="utf-8")
    dead_mount.add(str(tmp_path / "nas"))
    disk = dataclasses.replace(config().disk, stat_timeout_s=0.3)
    req = jobs.request(tmp_path / "src", tmp_path / "nas" / "ds", kind="text", disk=disk, dest_roots=())
    start = time.monotonic()
    with pytest.raises(StageFailure, match=r"nas.*statvfs no answer within 0.3 s \(a dead network mount\?\)"):
        stage(req)
    assert time.monotonic() - start < 10
