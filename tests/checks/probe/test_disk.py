"""Disk measurements for real, in temporary directories: figures, fio, bad locations, full disks, cleanup.

Read-only and full filesystems are real too: a child runs in a private mount namespace (``unshare -m``, root)
with a read-only bind mount or a tiny tmpfs, so nothing outside the test changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from checks.config import DiskConfig
from checks.probe import disk as probe_disk
from checks.probe.disk import measure_disks, measure_location
from checks.probe.diskio import SCRATCH_PREFIX, drop_cache, resident_fraction, scratch_dir, sweep_stale
from checks.probe.fio import fio_available
from checks.probe.mounts import read_mounts
from tests.factories import config
from tests.waiting import until

REPO = Path(__file__).resolve().parents[3]
FAST = replace(config().disk, budget_s=1.0, max_file_mib=64, max_small_files=200, checkpoint_gib=0.0625)


def scratch_left(path: Path) -> list[str]:
    return [p.name for p in path.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


def test_builtin_measures_every_figure_and_leaves_nothing(tmp_path: Path) -> None:
    loc = measure_location(str(tmp_path), True, read_mounts(), replace(FAST, use_fio=False))
    assert loc.error is None, loc
    assert loc.tool == "builtin" and loc.cold_read_method in ("fadvise", "o_direct")
    assert loc.seq_write_mb_s and loc.cold_read_mb_s and loc.small_files_per_s
    assert loc.file_bytes and loc.file_bytes % (1024**2) == 0
    assert loc.checkpoint_bytes == 64 * 1024**2 and loc.checkpoint_write_s is not None
    assert loc.kind == "local" and loc.fs_type and loc.free_bytes
    assert scratch_left(tmp_path) == []


@pytest.mark.slow
@pytest.mark.skipif(not fio_available(), reason="fio is not installed (apt-get install fio)")
def test_fio_measures_the_sequential_figures_when_installed(tmp_path: Path) -> None:
    loc = measure_location(str(tmp_path), True, read_mounts(), FAST)
    assert loc.error is None and loc.tool == "fio", loc
    assert loc.seq_write_mb_s and loc.cold_read_mb_s and loc.small_files_per_s
    assert scratch_left(tmp_path) == []


def test_page_cache_is_really_dropped(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(8 * 1024**2))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(os.open(path, os.O_RDONLY))
        warm = resident_fraction(fd, 8 * 1024**2)
    finally:
        os.close(fd)
    assert warm is not None and warm > 0.5
    assert drop_cache(str(path)) is True


def test_missing_and_unwritable_locations_are_reported_not_raised(tmp_path: Path) -> None:
    missing = measure_location(str(tmp_path / "nope"), True, read_mounts(), FAST)
    assert missing.error == "does not exist"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert measure_location(str(a_file), True, read_mounts(), FAST).error == "is not a directory"
    huge = replace(FAST, min_free_mib=1 << 40)
    assert (measure_location(str(tmp_path), True, read_mounts(), huge).error or "").startswith("disk full:")


def test_ctrl_c_mid_measurement_removes_the_test_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> None:
        assert scratch_left(tmp_path), "the scratch directory should exist while measuring"
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_disk, "small_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measure_location(str(tmp_path), True, read_mounts(), replace(FAST, use_fio=False))
    assert scratch_left(tmp_path) == []


def test_disabled_still_lists_mounts() -> None:
    facts = measure_disks(replace(FAST, enabled=False))
    assert facts.skipped and "disabled" in facts.skipped and facts.mounts and not facts.locations


CHILD = """
import json, os, sys
from dataclasses import asdict, replace
sys.path.insert(0, sys.argv[3])
from checks.config import make_config
from checks.probe.disk import measure_location
from checks.probe.mounts import read_mounts
cfg = replace(make_config().disk, **json.loads(sys.argv[2]))
loc = asdict(measure_location(sys.argv[1], True, read_mounts(), cfg))
loc["left"] = os.listdir(sys.argv[1])
print(json.dumps(loc))
"""


def in_mount_namespace(setup: str, path: Path, overrides: Mapping[str, object]) -> dict[str, object]:
    """Run measure_location in a private mount namespace after ``setup`` (shell) mounted something at ``path``."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    child = shlex.join([sys.executable, "-c", CHILD, str(path), json.dumps(overrides), str(REPO)])
    script = f"{setup} && exec {child}"
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip(f"mount namespaces are not allowed here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_read_only_filesystem(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    loc = in_mount_namespace(f"mount --bind {target} {target} && mount -o remount,bind,ro {target}", target, {})
    assert loc["left"] == []
    assert str(loc["error"]).startswith("read-only filesystem"), loc


@pytest.mark.slow
def test_disk_full_mid_write_stops_reports_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    overrides = {"min_free_mib": 1, "max_free_fraction": 1.0, "max_file_mib": 64, "use_fio": False, "budget_s": 5.0}
    setup = f"mount -t tmpfs -o size=24m tmpfs {target}"
    loc = in_mount_namespace(setup, target, overrides)
    assert str(loc["error"]).startswith("disk full while writing the test file"), loc
    assert loc["seq_write_mb_s"] is None and loc["left"] == []


@pytest.mark.slow
def test_sigterm_mid_measurement_removes_the_test_files(tmp_path: Path) -> None:
    """What a closed SSH session or `kill` does to a remote bootstrap: SIGTERM/SIGHUP clean up like Ctrl-C."""
    child = (
        "import sys; from dataclasses import replace; sys.path.insert(0, sys.argv[1])\n"
        "from checks.config import make_config\nfrom checks.probe.disk import measure_disks\n"
        "cfg = replace(make_config().disk, locations=(sys.argv[2],), budget_s=60.0, max_file_mib=8192, "
        "max_free_fraction=0.5, use_fio=False)\nmeasure_disks(cfg)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(REPO), str(tmp_path)], stderr=subprocess.PIPE)
    try:
        until(lambda: written(tmp_path), 30, what="the measurement to write its first bytes", while_running=proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert scratch_left(tmp_path) == []


def written(parent: Path) -> int:
    """Bytes in the test files under ``parent`` so far (the measurement is under way once there are any)."""
    total = 0
    for f in parent.glob(f"{SCRATCH_PREFIX}*/**/*"):
        with contextlib.suppress(OSError):  # a file the measurement removed between the listing and the stat
            total += f.stat().st_size if f.is_file() else 0
    return total


MAKER = """
import sys
sys.path.insert(0, sys.argv[1])
from checks.probe.diskio import scratch_dir
with scratch_dir(sys.argv[2]) as path:
    with open(path + "/test.bin", "wb") as fh:
        fh.write(b"x" * 65536)
    print(path, flush=True)
    sys.stdin.read()
"""


def scratch_of_a_process(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    """Start a process that makes a real scratch directory under ``parent`` and waits there."""
    proc = subprocess.Popen([sys.executable, "-c", MAKER, str(REPO), str(parent)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, "the child made no scratch directory"
    return proc, Path(line)


def scratch_of_a_killed_process(parent: Path) -> Path:
    """What `kill -9` during a measurement leaves: a scratch directory nobody will remove."""
    proc, path = scratch_of_a_process(parent)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert path.is_dir()
    return path


@pytest.mark.slow
def test_a_killed_runs_scratch_directory_is_swept_and_reported(tmp_path: Path) -> None:
    left = scratch_of_a_killed_process(tmp_path)
    loc = measure_location(str(tmp_path), True, read_mounts(), replace(FAST, use_fio=False))
    assert loc.error is None and loc.stale_removed == (str(left),) and loc.stale_removed_bytes == 65536, loc
    assert scratch_left(tmp_path) == []
    assert sweep_stale(str(tmp_path)).paths == ()


@pytest.mark.slow
def test_a_live_runs_scratch_directory_is_kept(tmp_path: Path) -> None:
    proc, path = scratch_of_a_process(tmp_path)
    try:
        with scratch_dir(str(tmp_path)) as mine:
            assert sweep_stale(str(tmp_path)).paths == ()
            assert path.is_dir() and Path(mine).is_dir()
    finally:
        proc.kill()
        proc.wait(30)
    assert sweep_stale(str(tmp_path)).paths == (str(path),)


def test_a_reused_pid_does_not_keep_a_dead_runs_directory(tmp_path: Path) -> None:
    """The name holds the creator's start time: the same PID on a later process is not the creator."""
    with scratch_dir(str(tmp_path)) as mine:
        head, pid, start, tail = Path(mine).name.rsplit("-", 3)
        assert int(pid) == os.getpid()
        reused = tmp_path / f"{head}-{pid}-{int(start) - 1}-{tail}"
        reused.mkdir()
        assert sweep_stale(str(tmp_path)).paths == (str(reused),)
        assert Path(mine).is_dir()


@pytest.mark.slow
def test_look_alikes_without_a_valid_owner_are_kept(tmp_path: Path) -> None:
    (tmp_path / "dead").mkdir()
    dead = scratch_of_a_killed_process(tmp_path / "dead")
    prefix = SCRATCH_PREFIX
    scope, rest = dead.name.removeprefix(prefix).split("-", 1)  # rest: a dead PID, its start time, random
    other_scope = f"{(int(scope, 16) + 1) % 16**8:08x}"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    kept = {
        prefix + "abc12345": "dir",  # an older version's name: no owner in it
        f"{prefix}{other_scope}-{rest}": "dir",  # another machine or boot, on a shared filesystem
        f"{prefix}{scope}-0-1-x": "dir",  # PID 0: not a process
        f"{prefix}{scope}-{rest}-extra-": "dir",
        f"gpu-preflight-disk-{scope}-{rest}": "dir",  # not hidden: not ours
        f"{prefix}{scope}-{rest}x": "symlink",  # would be stale, but a link is never followed
        f"{prefix}{scope}-{rest}y": "file",
    }
    for name, kind in kept.items():
        target = tmp_path / name
        if kind == "dir":
            target.mkdir()
            (target / "data").write_text("x")
        elif kind == "symlink":
            target.symlink_to(outside, target_is_directory=True)
        else:
            target.write_text("x")
    assert sweep_stale(str(tmp_path)).paths == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "dead", "outside"])
    assert (outside / "precious").read_text() == "keep me"
    assert sweep_stale(str(tmp_path / "dead")).paths == (str(dead),)
    assert sweep_stale(str(tmp_path / "missing")).paths == ()


def test_fast_config_is_a_disk_config() -> None:
    assert isinstance(FAST, DiskConfig)


def test_this_machine_gets_a_staging_verdict_naming_a_measured_local_location(tmp_path: Path) -> None:
    """End to end on the live machine: mounts, the found locations, and disk-data naming one of them."""
    from checks.machine.disk import disk_data
    from tests.factories import machine

    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    facts = measure_disks(replace(FAST, use_fio=False), home=str(home), tmp=str(tmp))
    assert facts.locations and facts.locations[0].path == str(home)  # tmp is on the same filesystem
    verdict = disk_data(machine(disks=facts), config(disk={"staging_min_free_gib": 0.0}))[0]
    assert verdict.value == str(home) and verdict.summary.startswith(f"stage data to {home}: ")
    assert scratch_left(home) == []


def test_recorded_disks_replay_and_unrecorded_ones_skip(tmp_path: Path) -> None:
    from checks.facts import DiskFacts, LocationFacts
    from checks.probe import SnapshotProbe
    from checks.snapshot import dump_snapshot
    from tests.factories import machine

    recorded = DiskFacts(locations=(LocationFacts("/data", cold_read_mb_s=2000.0, kind="local"),))
    for name, disks in (("with.json", recorded), ("without.json", None)):
        (tmp_path / name).write_text(json.dumps(dump_snapshot(machine(disks=disks), recorded=True)))
    with_disks = SnapshotProbe(tmp_path / "with.json")
    replayed = with_disks.measure(with_disks.machine(), config()).disks
    assert replayed is not None and replayed.recorded and replayed.locations == recorded.locations
    without = SnapshotProbe(tmp_path / "without.json")
    skipped = without.measure(without.machine(), config()).disks
    assert skipped is not None and skipped.skipped == "replayed snapshot: disk measurements need the live machine"
