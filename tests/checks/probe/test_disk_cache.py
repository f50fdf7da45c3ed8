"""Bootstrap's disk figures kept for stage-data: this boot only, bounded in age, never an error when unusable."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from checks.facts import LocationFacts
from checks.machine.runner import measure
from checks.probe import LocalProbe, disk_cache
from tests.factories import config, machine

FAST = LocationFacts(path="/scratch", mountpoint="/scratch", fs_type="ext4", kind="local", cold_read_mb_s=2100.0)
BROKEN = LocationFacts(path="/mnt/ro", error="read-only filesystem")


def test_round_trip_keeps_measured_locations_only(tmp_path: Path) -> None:
    path = tmp_path / "c" / "disks.json"
    assert disk_cache.save([FAST, BROKEN], path) == path
    got = disk_cache.load(3600, path)
    assert got is not None and got.locations == (FAST,) and 0 <= got.age_s < 60
    assert disk_cache.save([BROKEN], tmp_path / "none.json") is None and not (tmp_path / "none.json").exists()


def test_old_other_boot_or_broken_files_mean_measure_again(tmp_path: Path) -> None:
    path = tmp_path / "disks.json"
    disk_cache.save([FAST], path)
    assert disk_cache.load(3600, path, now=time.time() + 7200) is None  # two hours old, one allowed
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc | {"boot_id": "another-boot"}))
    assert disk_cache.load(3600, path) is None  # measured before a reboot: the disks may differ now
    for text in ("{not json", "[]", json.dumps(doc | {"schema": 99}), json.dumps(doc | {"locations": [{"x": 1}]})):
        path.write_text(text)
        assert disk_cache.load(3600, path) is None
    assert disk_cache.load(3600, tmp_path / "missing.json") is None


def test_cache_path_follows_xdg_then_home() -> None:
    assert disk_cache.cache_path({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/gpu-preflight/disks.json")
    assert disk_cache.cache_path({"HOME": "/h"}) == Path("/h/.cache/gpu-preflight/disks.json")


def test_an_unwritable_cache_is_skipped_silently(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert disk_cache.save([FAST], blocker / "sub" / "disks.json") is None


@pytest.mark.slow
def test_a_live_measurement_keeps_its_disk_figures(tmp_path: Path) -> None:
    cfg = config(bench={"enabled": False}, disk={"locations": [str(tmp_path)], "budget_s": 0.5, "max_file_mib": 8})
    facts = measure(LocalProbe(), machine(), cfg)
    assert facts.disks is not None and facts.disks.locations[0].cold_read_mb_s is not None
    kept = disk_cache.load(60)  # from $XDG_CACHE_HOME, private to this test (tests/conftest.py)
    assert kept is not None and [x.path for x in kept.locations] == [str(tmp_path)]
    assert kept.locations[0].cold_read_mb_s == facts.disks.locations[0].cold_read_mb_s
