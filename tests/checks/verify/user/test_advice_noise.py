"""The loader advice's decision against the box's own noise: re-runs of the unchanged command before and after the
candidates are the baseline, and a candidate is named only when it beats them by more than their spread.

The re-runs are scripted (``_Runs.run`` replaced by a queue of mean step times) so that each case is exact; the
re-runs themselves are real in tests/checks/verify/user/test_command.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from checks.verify.user import advice
from checks.verify.user.launch import CommandRun


def scripted(monkeypatch: pytest.MonkeyPatch, times: list[float]) -> list[Any]:
    """Each re-run takes the next mean step time; returns the settings the re-runs were started with."""
    started: list[Any] = []

    def run(self: advice._Runs, setting: dict[str, Any] | None) -> tuple[CommandRun, float | None] | None:
        if not times:
            return None
        started.append(setting)
        return CommandRun(argv=("python",), ended="stopped"), times.pop(0)

    monkeypatch.setattr(advice._Runs, "run", run)
    return started


def measure(monkeypatch: pytest.MonkeyPatch, times: list[float]) -> tuple[dict[str, Any], list[Any]]:
    started = scripted(monkeypatch, times)
    asked = {"num_workers": 0}
    out = advice.measure(("python", "t.py"), ".", asked, "t.py:9", 2.5, 2.0, False, 60.0, 0.10)  # 2.5 s: re-runs fit
    return out, started


def test_a_gain_beyond_the_spread_is_named_against_the_re_runs_not_the_measured_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Baselines 1.0 and 1.1 s (9.5% apart), two workers at 0.6 s: 1.75x, named; the measured run's 2.5 s is not
    the baseline."""
    out, started = measure(monkeypatch, [1.0, 0.6, 0.9, 0.95, 1.1])
    assert started[0] is None and started[-1] is None  # the unchanged command first and last
    assert out["baseline_runs"] == [1.0, 1.1] and out["baseline_mean_step_s"] == 1.05 and out["spread"] == 0.095
    assert out["faster"]["overrides"]["num_workers"] == 2 and out["faster"]["speedup"] == 1.75
    assert out["change"] == "DataLoader(..., num_workers=2, persistent_workers=True) at t.py:9"
    assert out["not_measurable"] is None


def test_a_spread_wider_than_the_gain_is_not_measurable_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Baselines 1.0 and 1.5 s (40% apart: a neighbour came), best candidate 0.95 s: 1.32x, less than the spread."""
    out, _ = measure(monkeypatch, [1.0, 0.95, 1.2, 1.1, 1.5])
    assert out["spread"] == 0.4 and out["faster"] is None and out["change"] is None
    assert out["not_measurable"].startswith("re-runs of the unchanged command differed by 40% (other processes")


def test_a_gain_near_a_wide_spread_is_run_again_alternated_and_the_means_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Baselines 1.0 and 1.1 s, best 0.85 s (1.24x): the spread (9.5%) is above half the 10% asked, so the best and
    the baseline run once more; the best's second run (1.0 s) brings it to 0.925 s, 1.11x over the three
    baselines' mean of 1.033 s: still above both the 10% and the spread, so named with its two runs."""
    out, started = measure(monkeypatch, [1.0, 0.85, 0.95, 0.97, 1.1, 1.0, 1.0])
    best = out["faster"]
    assert started[-2] == best["overrides"] and started[-1] is None  # alternated: the best, then the unchanged
    assert best["runs"] == [0.85, 1.0] and best["mean_step_s"] == 0.925
    assert out["baseline_runs"] == [1.0, 1.1, 1.0] and best["speedup"] == round(1.0333333 / 0.925, 3)


def test_no_re_run_of_the_unchanged_command_fits_so_the_measured_run_is_the_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, _ = measure(monkeypatch, [])
    assert out["baseline_runs"] == [] and out["baseline_mean_step_s"] == 2.5 and out["faster"] is None
    assert all("skipped" in r for r in out["candidates"])
