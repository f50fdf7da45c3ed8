"""``invoke stage-data`` run as a user runs it (``python -m invoke`` with a temporary HOME), kill -9 included."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.datasets.photos import image_tree
from tests.fakes.cli import REPO, Here, assert_usage_error, child_env, default_sigint, invoke, pid_gone
from tests.waiting import until

pytestmark = pytest.mark.slow
OUTPUTS = ("images.npy", "labels.npy", "classes.json")


def digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in OUTPUTS}


def stage_args(src: Path, dest: Path, *extra: str) -> list[str]:
    return ["stage-data", "--source", str(src), "--dest", str(dest), "--size", "64", "--max-rejects", "10", *extra]


def test_stage_then_noop_then_verify(photo_tree: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    first = invoke(tmp_path, *stage_args(photo_tree, dest))
    assert first.code == 0, first.why()
    assert "staged 72 images, 5 rejected into" in first.out and "images/s" in first.out
    assert "\r" not in first.err  # not a terminal, no --progress: no bars (lines every 5 s of a long step instead)
    again = invoke(tmp_path, *stage_args(photo_tree, dest))
    assert again.code == 0 and "already staged" in again.out and "nothing to do" in again.out, again.why()
    checked = invoke(tmp_path, "stage-data", "--verify", str(dest))
    assert checked.code == 0 and "hashes and shapes match" in checked.out, checked.why()
    with (dest / "labels.npy").open("r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x07")
    broken = invoke(tmp_path, "stage-data", "--verify", str(dest))
    assert broken.code == 1 and "labels.npy: sha256 differs" in broken.out, broken.why()


def test_progress_bars_go_to_stderr_on_request(photo_tree: Path, tmp_path: Path) -> None:
    run = invoke(tmp_path, *stage_args(photo_tree, tmp_path / "ds", "--progress"))
    assert run.code == 0, run.why()
    assert "decode" in run.err and "img/s" in run.err  # without the flag: none (test_stage_then_noop_then_verify)


def test_usage_errors_are_one_line_exit_2(here: Here, tmp_path: Path) -> None:
    """In this process (the task's checks are the point); test_bad_configuration_value_is_exit_2 is a real one."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd" / "x").mkdir(parents=True)
    (tmp_path / "odd" / "x" / "weights.bin").write_bytes(b"0")
    (tmp_path / "list.csv").write_text("path,comment\na.jpg,b\n")
    assert_usage_error(here(tmp_path, "stage-data", "--source", str(tmp_path / "empty")), "is empty")
    assert_usage_error(here(tmp_path, "stage-data", "--source", str(tmp_path / "odd")), "unknown format")
    assert_usage_error(here(tmp_path, "stage-data", "--source", str(tmp_path / "list.csv")), "no label column")
    assert_usage_error(here(tmp_path, "stage-data"), "needs --source")
    assert_usage_error(here(tmp_path, "stage-data", "--source", str(tmp_path / "nope")), "not found")
    assert_usage_error(here(tmp_path, "stage-data", "--verify", str(tmp_path / "empty")), "not a staged dataset")


def test_a_negative_worker_count_is_refused_naming_the_flag(here: Here, photo_tree: Path, tmp_path: Path) -> None:
    """``--workers -2`` was accepted before; 0 is documented: the usable cores less reserve_cores."""
    for bad in ("-2", "-1"):
        line = assert_usage_error(here(tmp_path, *stage_args(photo_tree, tmp_path / "ds", "--workers", bad)))
        assert f"--workers {bad}" in line and "0 for the usable cores" in line
    line = assert_usage_error(here(tmp_path, *stage_args(photo_tree, tmp_path / "ds", "--reserve-cores", "-3")))
    assert "--reserve-cores -3" in line
    assert not (tmp_path / "ds").exists() and not (tmp_path / ".ds.staging").exists()


def test_a_fifo_in_the_source_is_skipped_with_a_word_and_nothing_is_left_behind(tmp_path: Path) -> None:
    """A FIFO named like a photo used to make stage-data hang with no output and leave .DEST.staging."""
    src = image_tree(tmp_path / "src", per_class=3, classes=("cat", "dog"))
    os.mkfifo(src / "cat" / "pipe.jpg")
    run = invoke(tmp_path, *stage_args(src, tmp_path / "ds", "--workers", "1"), timeout=60)
    assert run.code == 0, run.why()
    assert "staged 6 images into" in run.out, run.why()
    assert "skipped 1 special file" in run.err and "cat/pipe.jpg" in run.err, run.why()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"], run.why()  # no .ds.staging, no .ds.lock


def test_bad_configuration_value_is_exit_2(photo_tree: Path, tmp_path: Path) -> None:
    run = invoke(tmp_path, *stage_args(photo_tree, tmp_path / "ds"), INVOKE_PREFLIGHT_STAGE_RESIZE="squash")
    assert_usage_error(run, "unknown --resize 'squash'")


def test_default_destination_is_under_a_configured_root(photo_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "invoke.yaml").write_text(f'preflight:\n  stage:\n    dest_roots: ["{tmp_path / "disk"}"]\n')
    (tmp_path / "disk").mkdir()
    run = invoke(
        tmp_path,
        "-f",
        str(tmp_path / "invoke.yaml"),
        "stage-data",
        "--source",
        str(photo_tree),
        "--size",
        "32",
        "--max-rejects",
        "5",
    )
    assert run.code == 0, run.why()
    assert (tmp_path / "disk" / "staged" / "train-32px" / "manifest.json").is_file()


def _start(home: Path, args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=child_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass(frozen=True)
class Straight:
    """``big_tree`` staged by one uninterrupted run: the bytes a killed or interrupted run must end with."""

    digests: dict[str, str]
    seconds: float


@pytest.fixture(scope="module")
def straight(big_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Straight:
    home = tmp_path_factory.mktemp("straight")
    t0 = time.monotonic()
    run = invoke(home, *stage_args(big_tree, home / "straight", "--workers", "2"))
    assert run.code == 0, run.why()
    return Straight(digests(home / "straight"), time.monotonic() - t0)


def test_kill_9_at_random_points_then_resume_is_byte_identical(
    big_tree: Path, straight: Straight, tmp_path: Path
) -> None:
    """The done-means test: a few hundred real photos, planted broken files, SIGKILL anywhere, same bytes."""
    duration, want = straight.seconds, straight.digests
    dest, rng, kills = tmp_path / "killed", random.Random(20261129), 0
    for _ in range(5):
        proc = _start(tmp_path, stage_args(big_tree, dest, "--workers", "2"))
        time.sleep(rng.uniform(0.3, duration))  # a random point of the run: what the test is about
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        if dest.exists():  # whatever is visible under the final name is complete
            assert json.loads((dest / "manifest.json").read_text())["counts"]["staged"] == 300
            break
    assert kills >= 2, "the run was too fast to be killed; the test proves nothing"
    last = invoke(tmp_path, *stage_args(big_tree, dest, "--workers", "2"))
    assert last.code == 0, last.why()
    assert digests(dest) == want
    assert not (tmp_path / ".killed.staging").exists()
    doc = json.loads((dest / "manifest.json").read_text())
    assert doc["counts"] == {"inputs": 305, "staged": 300, "rejected": 5, "tokens": 0}


def _with_workers(tree: dict[int, int], n: int) -> dict[int, int] | None:
    """``tree`` once it holds ``n`` decode workers (grandchildren of the staging process), else None."""
    return tree if len([p for p, depth in tree.items() if depth == 2]) >= n else None


def test_killed_parent_leaves_no_worker_behind(big_tree: Path, tmp_path: Path) -> None:
    """The decode workers are forks of a fork server (grandchildren): kill -9 of the staging process ends them all."""
    proc = _start(tmp_path, stage_args(big_tree, tmp_path / "ds", "--workers", "2"))
    try:
        tree = until(lambda: _with_workers(_descendants(proc.pid), 2), 20, what="two decode workers")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len([p for p, depth in tree.items() if depth == 2]) == 2, tree
    until(lambda: all(pid_gone(p) for p in tree), 5, what=f"every process of {tree} to end")


def test_ctrl_c_ends_the_workers_exits_130_and_the_same_command_resumes(
    big_tree: Path, straight: Straight, tmp_path: Path
) -> None:
    dest = tmp_path / "ds"
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", *stage_args(big_tree, dest, "--workers", "2")],
        cwd=REPO,
        env=child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a foreground job on a terminal
        preexec_fn=default_sigint,
    )
    journal = tmp_path / ".ds.staging" / "journal.jsonl"
    try:
        tree = dict[int, int]()

        def decoded() -> bool:
            nonlocal tree
            tree = _descendants(proc.pid) or tree
            return '"chunk"' in (journal.read_text() if journal.exists() else "")

        # the journal lives only while the run is in its middle: looked at every 20 ms, not with a growing pause
        until(decoded, 30, what="a chunk decoded (in the journal)", while_running=proc, every=0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the foreground process group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, f"{proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in out + err, err
    assert tree
    # the fork server and the resource tracker see the pipes close and leave
    until(lambda: all(pid_gone(p) for p in tree), 5, what=f"every process of {tree} to end")
    assert (tmp_path / ".ds.staging").is_dir() and not dest.exists()
    resumed = invoke(tmp_path, *stage_args(big_tree, dest, "--workers", "2"))
    assert resumed.code == 0 and "resumed:" in resumed.out, resumed.why()
    assert digests(dest) == straight.digests


def test_decode_workers_import_neither_the_entry_script_nor_the_probe(photo_tree: Path, tmp_path: Path) -> None:
    """Run as users run it (Invoke's console script, so multiprocessing knows the main module by its path), with
    ``-X importtime`` (children inherit it): the entry script loads only in the staging process, the decode module
    there and once in the fork server (not once per worker), the host probe only in the staging process."""
    script = Path(sysconfig.get_path("scripts")) / "invoke"
    if not script.is_file():
        pytest.skip(f"no Invoke console script at {script}")
    env = child_env(tmp_path)
    args = stage_args(photo_tree, tmp_path / "ds", "--workers", "3")
    run = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = Counter(line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if "import time:" in line)
    assert loaded["invoke.main"] == 1  # spawned workers made it 1 + 3
    assert loaded["datasets.decode"] == 2  # the staging process and the fork server; spawn: 1 + 3
    assert loaded["checks.probe.host"] == 1


def _descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid`` (pid -> depth: 1 for a child)."""
    found: dict[int, int] = {}
    level, depth = [pid], 1
    while level:
        level = [int(c) for p in level for c in _children(p)]
        found.update((c, depth) for c in level)
        depth += 1
    return found


def _children(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}/task/{pid}/children").read_text()).split()
    except OSError:
        return []


def test_without_dest_the_fastest_measured_root_wins_and_keeps_the_dataset(
    photo_tree: Path, tmp_path: Path, ext4_disk: Path
) -> None:
    from checks.facts import LocationFacts
    from checks.probe import disk_cache

    home = tmp_path / "home"
    home.mkdir()
    disk = tmp_path / "disk"  # on this box's own filesystem; ext4_disk is another one
    disk.mkdir()
    conf = tmp_path / "invoke.yaml"
    conf.write_text(f'preflight:\n  stage:\n    dest_roots: ["{disk}", "{ext4_disk}"]\n')
    # bootstrap measured the loop disk (by its mount point) as far faster: no need to measure it again
    kept = LocationFacts(path=str(ext4_disk), mountpoint=str(ext4_disk), fs_type="ext4", cold_read_mb_s=99_000.0)
    assert disk_cache.save([kept]) == disk_cache.cache_path()
    args = ["-f", str(conf), "stage-data", "--source", str(photo_tree), "--size", "16", "--max-rejects", "5"]
    run = invoke(home, *args)
    assert run.code == 0, run.why()
    why = next(line for line in run.err.splitlines() if line.startswith("staging to "))
    assert why.startswith(f"staging to {ext4_disk} (ext4,") and "99.0 GB/s cold read (measured by bootstrap" in why
    assert f"{disk} " in why and "(measured now)" in why  # the other root was measured on the spot
    assert (ext4_disk / "staged" / "train-16px" / "manifest.json").is_file()
    # bootstrap's figures gone, the other root may now measure faster: the staged copy stays where it is
    disk_cache.cache_path().unlink()
    again = invoke(home, *args)
    assert again.code == 0 and "already staged" in again.out, again.why()
    assert f"staging to {ext4_disk}: it already holds train-16px" in again.err
    assert not (disk / "staged").exists()


def test_resume_after_too_many_rejects_says_what_an_earlier_run_decoded(tmp_path: Path) -> None:
    """The broken file sorts last: the failed run decoded everything, the resumed one decodes nothing."""
    from tests.datasets.photos import image_tree

    src = image_tree(tmp_path / "src", per_class=3)
    (src / "fish" / "zz-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    args = ["stage-data", "--source", str(src), "--dest", str(tmp_path / "ds"), "--size", "16", "--workers", "1"]
    failed = invoke(tmp_path, *args, "--max-rejects", "0")
    assert failed.code == 1 and "gpu-preflight: 1 image rejected (of 10)" in failed.err, failed.why()
    resumed = invoke(tmp_path, *args, "--max-rejects", "1")
    assert resumed.code == 0, resumed.why()
    assert "staged 9 images, 1 rejected into" in resumed.out
    assert "resumed: all 10 images were decoded by an earlier run, none left for this one" in resumed.out
    assert "0 images/s" not in resumed.out
