"""Re-runs that cannot fit the seconds left are skipped before any starts (checks/verify/user/rerun.py): on a
crowded box a step of the tool's script on 224 px photos took 11.6 s, and the model-side re-runs spent 58 s of the
budget to time nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checks.verify.contract import Cut
from checks.verify.user import advice, judge, modelfix
from checks.verify.user import run as run_user
from checks.verify.user.launch import CommandRun
from checks.verify.user.rerun import START_S, too_slow

NEVER = ("/nonexistent/never-started",)
SCRIPTS = Path(__file__).parent / "scripts"  # a re-run that started would fail loudly


def test_the_pace_decides_whether_two_reruns_fit() -> None:
    assert too_slow(0.05, 10, 60.0) == ""  # 2 x (3 + 0.5) s: fits
    why = too_slow(11.6, 10, 58.0)
    assert (
        why
        == f"2 re-runs of 10 steps at 11.60 s a step need about {2 * (START_S + 116):.0f} s, more than the 58 s left"
    )
    assert too_slow(None, 10, 1.0) == "" and too_slow(0.0, 10, 1.0) == ""  # no pace known: let the budget decide


def test_model_reruns_that_cannot_fit_are_skipped_without_starting_one() -> None:
    got = modelfix.measure(NEVER, ".", ["bf16", "channels_last"], CommandRun(argv=NEVER), 58.0, 0.1, step_s=11.6)
    assert got["seconds"] == 0.0 and got["faster"] is None and got["baseline_runs"] == 0
    assert [r["change"] for r in got["candidates"]] == ["bf16", "channels_last"]
    assert all(r["skipped"].startswith("2 re-runs of 10 steps at 11.60 s a step") for r in got["candidates"])
    assert "bf16" in got["not_timed"]  # still named, untimed


def test_loader_reruns_that_cannot_fit_are_skipped_and_say_why() -> None:
    got = advice.measure(NEVER, ".", {"num_workers": 0}, "train.py:12", 11.6, 2.0, False, 58.0, 0.1)
    assert got["seconds"] == 0.0 and got["faster"] is None and got["change"] is None
    assert got["candidates"] and all("need about" in r["skipped"] for r in got["candidates"])
    assert got["not_measurable"].startswith("2 re-runs of 10 steps at 11.60 s a step")


@pytest.mark.slow  # a real command under verify: 7.5 s on the 2-core box
def test_channels_last_is_not_timed_for_a_model_without_4d_weights(tmp_path: Path) -> None:
    """A run already in bf16 gets no bf16 re-run, so channels_last was the first change and nothing told it the
    model has no convolution: its re-run changed nothing and was named "1.90x faster" from the box's noise (and the
    code it named crashes an MLP). The change's own re-run says whether it found 4-D weights."""
    argv = (sys.executable, str(SCRIPTS / "bf16_autocast.py"))
    got = modelfix.measure(argv, str(tmp_path), ["channels_last"], CommandRun(argv=argv), 120.0, 0.1)
    row = next(r for r in got["candidates"] if r["change"] == "channels_last")
    assert row.get("skipped") == modelfix.NO_CONV and "speedup" not in row, got
    assert got["faster"] is None and "channels_last" not in got["not_timed"]


def test_model_gains_within_the_noise_of_the_unchanged_reruns_are_not_measurable() -> None:
    rows = [{"change": "bf16", "mean_step_s": 0.5, "loss_agrees": True, "speedup": 1.4}]
    assert modelfix.pick(rows, 0.1) == rows[0]
    assert modelfix.pick(rows, max(0.1, modelfix._spread([0.5, 0.9]))) is None  # baselines 80% apart
    advice = {"faster": None, "candidates": rows, "not_timed": [], "min_gain": 0.1, "not_measurable": "differed by 80%"}
    fix = judge.model_fix(advice, "rule")
    assert fix.startswith("no model-side change is measurable on this box now: differed by 80% (bf16: 1.40x)"), fix


def test_an_advice_cut_is_kept_only_when_the_reruns_were_limited() -> None:
    cut = Cut("advice", "the loader re-runs limited to 94 s of verify.command_advice_s 120 s", "--budget 150")
    fits = {"candidates": [{"overrides": {"num_workers": 2}, "mean_step_s": 0.4}], "seconds": 41.8}
    cuts = [cut]
    run_user._kept_cut(fits, cuts)
    assert cuts == []  # every candidate ran in 42 s: nothing was cut
    cuts = [cut]
    run_user._kept_cut({"candidates": [{"change": "bf16", "skipped": "3 s of verify.command_advice_s left"}]}, cuts)
    assert cuts == [cut]
