"""Re-runs that cannot fit the seconds left are skipped before any starts (checks/verify/user/rerun.py): on a
crowded box a step of the tool's script on 224 px photos took 11.6 s, and the model-side re-runs spent 58 s of the
budget to time nothing."""

from __future__ import annotations

from checks.verify.user import advice, modelfix
from checks.verify.user.launch import CommandRun
from checks.verify.user.rerun import START_S, too_slow

NEVER = ("/nonexistent/never-started",)  # a re-run that started would fail loudly


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
