"""Measured loader advice on real pipelines, trained for real on the CPU by the tool's own script: the verdict, and
that the loader setting it names was measured faster on the script itself (re-runs with the setting injected
where the script builds its DataLoader: ``checks/verify/user/advice.py``), read from the JSON measurements.

- real JPEG photos decoded and blurred in the training process: more workers measure faster (CPU work per
  sample) and are named, with the line that builds the loader;
- the same photos through two workers: a sample's time split into its Compose-like transforms (the blur the
  costliest), and what pre-decoding with stage-data would remove, an estimate;
- the same CPU-heavy pipeline saturating the cores beside a real neighbour taking ~10% of one core: it is ours;
- memory-mapped samples through workers: ``num_workers=0`` timed where a step waited longer than its batch took
  to make (the hand-off), and named only where measured faster (on this box it measured slower);
- 10 ms of CPU per sample through eight workers: no re-run reads faster than the cores can make batches (the
  batches the workers made while the script started are not counted as speed), and one worker per core is timed.

The box has 2 cores that other jobs share, so the assertions are on the ratios verify itself measured, with its
margins (``advice_min_gain`` and the spread of the unchanged re-runs), never on absolute rates. The re-runs get the
least time that still proves the point (``command_advice_s``), and none where advice is not asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.config import make_config
from tests.fakes.planted import PLUGINS, REPO, builtin, config
from tests.fakes.verdicts import planted_row

pytestmark = [pytest.mark.slow, pytest.mark.measures]
GAIN = make_config().verify.advice_min_gain
SITE = str(REPO / "templates" / "train.py")  # where the script builds its DataLoader (the advice names the line)


def timed(m: dict[str, Any]) -> dict[str, Any]:
    """``measurements.command_advice``, checked against itself: every candidate that ran has its speed-up over the
    unchanged re-runs, and one is named only when it beat them by the margin."""
    advice = m["command_advice"]
    assert advice["site"].startswith(SITE + ":"), advice["site"]
    ran = [c for c in advice["candidates"] if c.get("mean_step_s")]
    if not ran:  # each re-run is started only when the time left covers the longest so far
        skipped = [c.get("skipped") for c in advice["candidates"]]
        pytest.skip(f"no candidate fitted the re-runs' time on this crowded box ({advice['seconds']} s): {skipped}")
    assert all(c["speedup"] == round(advice["baseline_mean_step_s"] / c["mean_step_s"], 3) for c in ran)
    if advice["faster"]:
        assert advice["faster"]["speedup"] >= 1 + max(GAIN, advice["spread"])
    return advice


def test_memory_mapped_samples_through_workers_time_no_workers_and_name_it_only_when_measured_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """196 KB samples read from a memory map through two workers (the strided model: almost free). Where each
    step waited longer than its batch took the workers to make (``item_cost``: 0.2 ms of __getitem__ and 5.7 ms of
    collate a step on this box), the hand-off may be the wait and ``num_workers=0`` is timed first; it is named
    only where it measured ``advice_min_gain`` faster than the unchanged re-runs.

    Whether it wins cannot be asserted on this box: there the two workers' re-run measured 4.4 ms a step and no
    workers 12.8 ms (0.34x; the small planted images through two workers: 3.7 against 8.0 ms, 0.46x), the
    collate being what the workers split; and at a load of 7 the workers' batches took longer than the wait (no
    ``num_workers=0`` to time). So the assertions are that it is timed where the wait says so, never where it does
    not, and judged by the margins."""
    run = builtin(
        tmp_path, monkeypatch, config(command_advice_s=40.0), steps=10, replay=False,
        dataset=f"{PLUGINS}:mapped", model=f"{PLUGINS}:strided_model", workers=2,
    )  # fmt: skip
    cost, advice = run.m["item_cost"], timed(run.m)
    assert cost["where"] == "workers", cost
    made_ms = cost["getitem_ms_per_step"] + cost["collate_ms_per_step"]
    wait_ms = 1e3 * run.m["step_breakdown"]["data_wait"] * run.m["step_time"]["mean_s"]  # the pace-setter's
    tried = [c["overrides"]["num_workers"] for c in advice["candidates"]]
    if wait_ms >= 1.1 * made_ms:
        assert tried[0] == 0 and advice["candidates"][0]["overrides"]["persistent_workers"] is False, advice
    elif wait_ms <= 0.9 * made_ms:
        assert 0 not in tried, (wait_ms, made_ms, advice)
    fix = planted_row(run.m)["fix"]
    if advice["faster"] is not None:
        assert advice["change"] == f"--workers {advice['faster']['overrides']['num_workers']}", advice
        assert fix.startswith(advice["change"] + ": measured"), fix
    alone: dict[str, Any] = next((c for c in advice["candidates"] if c["overrides"]["num_workers"] == 0), {})
    if alone.get("speedup") is not None and alone["speedup"] < 1 + max(GAIN, advice["spread"]):
        assert not fix.startswith("--workers 0"), fix  # measured no faster: never advised


def test_a_short_re_run_claims_no_more_than_the_cores_can_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~10 ms of CPU per sample (``thread_time``), batches of 16, eight workers: a step needs 160 ms of CPU, so no
    loader setting can run it faster than 160 ms over the usable cores. Workers make ``num_workers x
    prefetch_factor`` batches while the script starts; a re-run of 2 + 8 steps read them (the bench once
    "measured" 16 workers with prefetch 4 5.71x faster on 2 cores). Every re-run's mean is over steps after those
    batches are used up: none reads faster than the cores allow (10% slack for the clocks)."""
    run = builtin(
        tmp_path, monkeypatch, config(command_advice_s=45.0), steps=10, replay=False,
        dataset=f"{PLUGINS}:busy", model=f"{PLUGINS}:tiny_model", workers=8,
    )  # fmt: skip
    advice = run.m["command_advice"]
    cores = len(os.sched_getaffinity(0))
    floor = 16 * 0.010 / cores
    assert advice["candidates"][0]["overrides"]["num_workers"] == cores, advice  # fewer: one per core first
    ran = [c for c in advice["candidates"] if c.get("mean_step_s")]
    if not ran and not advice["baseline_runs"]:
        pytest.skip(f"no re-run fitted the re-runs' time on this crowded box ({advice['seconds']} s)")
    assert all(b >= 0.9 * floor for b in advice["baseline_runs"]), advice  # 8 workers x 2 made ahead: 16 batches
    assert all(c["mean_step_s"] >= 0.9 * floor for c in ran), advice
    assert all(c["speedup"] <= advice["baseline_mean_step_s"] / (0.9 * floor) for c in ran), advice


@pytest.fixture
def photos(monkeypatch: pytest.MonkeyPatch) -> None:
    """The photos are scikit-image's: skip here, not in the script, without it."""
    from tests.datasets.photos import photo_bytes

    photo_bytes("rocket.jpg")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_decoded_and_blurred_photos_advise_more_workers_measured_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photos: None
) -> None:
    # ~20 ms of CPU per sample, ~0.3 s a step of 16 in the training process; two workers split it. (With batches of
    # 4 a re-run's 8 steps took under a second: the box's noise between re-runs was larger than the gain.)
    run = builtin(
        tmp_path, monkeypatch, config(command_advice_s=25.0), steps=8, replay=False,
        dataset=f"{PLUGINS}:blurred_photos", model=f"{PLUGINS}:tiny_model", workers=0,
    )  # fmt: skip
    verdict = planted_row(run.m)
    assert verdict["id"] in ("data-bound", "cpu-starved"), verdict
    advice = timed(run.m)
    if advice["not_measurable"]:
        pytest.skip(f"the box's own noise hid any loader change: {advice['not_measurable']}")
    faster = advice["faster"]
    crowded = next((v for v in run.m["diagnosis"]["verdicts"] if v["id"] == "cpu-contended"), None)
    if faster is None and crowded is not None:
        ev = crowded["evidence"]
        pytest.skip(
            f"other jobs on this box kept its cores {ev['machine_cpu']:.0%} busy, the script's processes "
            f"{ev['tree_cpu']:.0%}: a second worker had no core of its own to decode on (no setting measured "
            f"{GAIN:.0%} faster: {[c.get('speedup') for c in advice['candidates']]})"
        )
    assert faster is not None and faster["overrides"]["num_workers"] >= 1, advice
    assert advice["change"] == f"--workers {faster['overrides']['num_workers']}", advice  # the script's own flag
    assert verdict["fix"].startswith(advice["change"] + ": measured"), verdict["fix"]
    # Where a sample's time goes, as the script ran it: every sample was made in the training process.
    cost = run.m["item_cost"]
    assert cost["where"] == "training process" and cost["getitem_ms_per_sample"] > 5, cost


def test_decoded_and_blurred_photos_split_a_samples_time_into_its_transforms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photos: None
) -> None:
    """The same photos through two DataLoader workers: the agent times each step of the dataset's Compose-like
    ``transform`` in a sample of the workers' batches (``measurements.item_cost.split``), and the data verdict's fix
    names the blur, its share, and what pre-decoding with stage-data would remove (an estimate). Shares, not times:
    a crowded box slows every part alike. One run here: the blur 61% of a sample (54 ms of 88 at a load of 5),
    ColorJitter 18%, read + decode 15%, the crop 5%."""
    run = builtin(
        tmp_path, monkeypatch, config(), steps=6, replay=False,
        dataset=f"{PLUGINS}:blurred_photos", model=f"{PLUGINS}:tiny_model", workers=2,
    )  # fmt: skip
    verdict = planted_row(run.m)
    assert verdict["id"] in ("data-bound", "cpu-starved"), verdict
    split = run.m["item_cost"]["split"]
    assert split["method"] == "compose" and split["pipeline"] == "BlurredPhotos.transform", split
    top, shares = split["parts"][0], {p["name"]: p["share"] for p in split["parts"]}
    assert set(shares) == {"ColorJitter", "GaussianBlur", "RandomResizedCrop", "ToArray", "read + decode"}, split
    assert top["name"] == "GaussianBlur" and top["share"] > 0.4, split
    assert shares["read + decode"] < top["share"], split
    fix = verdict["fix"]
    assert f"GaussianBlur is the costliest transform ({top['share']:.0%}, " in fix, fix
    assert "pre-decoding with invoke stage-data" in fix and "read + decode" in fix and "estimate" in fix, fix


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that burns ~10% of one core: 10 ms of spinning every 100 ms."""
    spin = "import time\nwhile True:\n    e = time.monotonic() + 0.01\n    while time.monotonic() < e: pass\n    time.sleep(0.09)"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    yield proc
    proc.kill()
    proc.wait()


def test_a_small_neighbour_does_not_take_the_blame_for_a_saturated_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photos: None, neighbour: subprocess.Popen[bytes]
) -> None:
    """Who is blamed is the rule's: the advice re-runs are the test above's (off here). Batches stay at 16: with
    4-sample batches the waits are too short for the sampler to see the cores saturated."""
    cfg = config()
    run = builtin(
        tmp_path, monkeypatch, cfg, steps=20, replay=False, dataset=f"{PLUGINS}:blurred_photos",
        model=f"{PLUGINS}:tiny_model", workers=4,
    )  # fmt: skip
    assert neighbour.poll() is None  # it ran throughout
    verdicts = run.m["diagnosis"]["verdicts"]
    verdict = planted_row(run.m)
    ev = verdict["evidence"]
    others = ev["machine_cpu_during_wait"] - ev["cpu_during_wait"]
    if others >= cfg.verify.contended_min_share:
        pytest.skip(
            f"other jobs on this box took {others:.0%} of the cores during the run besides the planted neighbour "
            f"(~5%): a real contention of {cfg.verify.contended_min_share:.0%} or more, not what this test plants"
        )
    assert verdict["id"] == "cpu-starved", verdicts
    assert "other processes take the CPU" not in verdict["summary"]
    assert "cpu-contended" not in [v["id"] for v in verdicts]
