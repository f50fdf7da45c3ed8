"""Measured DataLoader advice for the user's own command: re-run it briefly with candidate settings, name one
only when it measured ``advice_min_gain`` faster.

The agent applies the candidate at construction (``DataLoader.__init__``: ``num_workers``, ``persistent_workers``,
``prefetch_factor``, ``pin_memory`` on a GPU) to every loader the command builds. Each re-run is the same command
stopped after a short warm-up and a few steps; the comparison is the mean step time of the measured steps (sums,
as the breakdown: bursty waits with workers would hide in a median).

The baseline is re-runs of the unchanged command timed the same way, one before the candidates and one after
(the measured run itself was timed over more steps, under the sampler, and differs from a re-run by more than a
loader change gains). Their spread (max - min over their mean) is the noise of this box now: a candidate is named
only when it measured faster by more than ``min_gain`` and more than that spread. When the best one would be
named but the spread is above half of ``min_gain`` (a neighbour came and went), it and the baseline are run once
more, alternated, and the means decide. A spread of ``min_gain`` or more with nothing named is "not measurable
here" (``not_measurable``), which the fix says instead of a guess. All re-runs together stay within
``verify.command_advice_s``: a run is started only when the time left covers the longest run so far, and it is
stopped when the time is up.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from checks.verify.user import judge as j
from checks.verify.user.launch import CommandRun, StopRule, run_command
from checks.verify.user.rerun import too_slow

RERUN_WARMUP = 2  # the first step holds start-up; the second the workers' first batches
RERUN_STEPS = 8


def candidates(asked: dict[str, Any], cores: float, cuda: bool) -> list[dict[str, Any]]:
    """Settings worth timing against the loader's own, most promising first (more workers, kept alive)."""
    current = int(asked.get("num_workers") or 0)
    usable = max(1, int(cores))
    counts = sorted({c for c in (usable, max(1, 2 * current), current + 1) if c > current}, reverse=True)
    out: list[dict[str, Any]] = []
    for count in counts[:2]:
        setting: dict[str, Any] = {"num_workers": count, "persistent_workers": True}
        if cuda:
            setting["pin_memory"] = True
        out.append(setting)
    if out:
        out.append({**out[0], "prefetch_factor": 4})
    return out


def mean_step_s(run: CommandRun, warmup: int, steps: int) -> float | None:
    lead = j.rerun_lead(run, warmup, steps)
    figs = j.rank_figures(lead) if lead else None
    return figs.fig.mean_s if figs else None


def measure(
    argv: Sequence[str],
    cwd: str,
    asked: dict[str, Any],
    site: str,
    base_step_s: float,
    cores: float,
    cuda: bool,
    budget_s: float,
    min_gain: float,
) -> dict[str, Any]:
    """``measurements.command_advice``: the baseline re-runs and their spread, each candidate's mean step time and
    speed-up over them, and the change to make (or none, or that none is measurable here). ``base_step_s`` (the
    measured run's) is the baseline only when no re-run of the unchanged command fit the budget."""
    start = time.monotonic()
    if slow := too_slow(base_step_s, RERUN_WARMUP + RERUN_STEPS, budget_s):
        unrun = [{"overrides": setting, "skipped": slow} for setting in candidates(asked, cores, cuda)]
        none: dict[str, Any] = {"baseline_mean_step_s": round(base_step_s, 6), "baseline_runs": [], "spread": 0.0}
        none |= {"site": site, "candidates": unrun, "min_gain": min_gain, "faster": None, "change": None}
        return none | {"not_measurable": slow, "seconds": 0.0, "interrupted": False}
    timer = _Runs(argv, cwd, budget_s, start)
    baselines: list[float] = []
    rows: list[dict[str, Any]] = []
    first = timer.run(None)
    if first is not None and first[1]:
        baselines.append(first[1])
    for setting in candidates(asked, cores, cuda):
        if timer.interrupted:
            break
        done = timer.run(setting)
        if done is None:
            rows.append({"overrides": setting, "skipped": f"{timer.left():.0f} s of verify.command_advice_s left"})
            continue
        run, step_s = done
        row: dict[str, Any] = {"overrides": setting, "ended": run.ended, "processes_left": run.left}
        rows.append(row | ({"mean_step_s": round(step_s, 6), "runs": [round(step_s, 6)]} if step_s else {}))
    if any(r.get("mean_step_s") for r in rows) and not timer.interrupted:
        last = timer.run(None)  # the closing baseline: a box that slowed down or sped up shows in the spread
        if last is not None and last[1]:
            baselines.append(last[1])
    best = _best(rows, baselines or [base_step_s])
    # one baseline has no spread to judge by: a candidate that beat it is timed again, alternated, whatever it shows
    if (
        best is not None
        and _gain(best, baselines) >= 1 + min_gain
        and (len(baselines) < 2 or spread(baselines) > min_gain / 2)
    ):
        again = timer.run(best["overrides"])  # a wide spread: once more each, alternated, and the means decide
        back = timer.run(None) if again is not None and again[1] else None
        if again is not None and again[1] and back is not None and back[1]:
            best["runs"].append(round(again[1], 6))
            best["mean_step_s"] = round(statistics.fmean(best["runs"]), 6)
            baselines.append(back[1])
    base = statistics.fmean(baselines) if baselines else base_step_s
    for r in rows:
        if r.get("mean_step_s"):
            r["speedup"] = round(base / r["mean_step_s"], 3)
    noise = spread(baselines)
    best = max((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"], default=None)
    faster = best if best and best["speedup"] >= 1 + max(min_gain, noise) else None
    out: dict[str, Any] = {"baseline_mean_step_s": round(base, 6), "baseline_runs": [round(b, 6) for b in baselines]}
    out |= {"spread": round(noise, 3), "site": site, "candidates": rows, "min_gain": min_gain, "faster": faster}
    out["change"] = change(faster["overrides"], asked, site) if faster else None
    out["not_measurable"] = (
        f"re-runs of the unchanged command differed by {noise:.0%} (other processes on the box?), more than the "
        f"{min_gain:.0%} a change must gain"
        if faster is None and noise >= min_gain
        else None
    )
    out["seconds"] = round(time.monotonic() - start, 1)
    out["interrupted"] = timer.interrupted
    return out


def spread(values: Sequence[float]) -> float:
    """(max - min) / mean of repeated timings of one setting; 0 with fewer than two."""
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) >= 2 else 0.0


def _best(rows: list[dict[str, Any]], baselines: Sequence[float]) -> dict[str, Any] | None:
    timed = [r for r in rows if r.get("mean_step_s")]
    return min(timed, key=lambda r: r["mean_step_s"], default=None) if baselines else None


def _gain(row: dict[str, Any], baselines: Sequence[float]) -> float:
    return statistics.fmean(baselines) / row["mean_step_s"] if baselines else 0.0


class _Runs:
    """Re-runs of the command within the advice budget: one is started only when the time left covers the longest
    so far; ``run`` gives (the run, its mean step time or None), or None when it did not fit."""

    def __init__(self, argv: Sequence[str], cwd: str, budget_s: float, start: float) -> None:
        self.argv, self.cwd, self.budget_s, self.start = argv, cwd, budget_s, start
        self.longest, self.interrupted = 0.0, False

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def run(self, setting: dict[str, Any] | None) -> tuple[CommandRun, float | None] | None:
        left = self.left()
        if self.interrupted or left <= max(self.longest, 1.0):
            return None
        rule = StopRule(RERUN_WARMUP, RERUN_STEPS, first_step_s=left, stall_s=left, limit_s=left)
        t0 = time.monotonic()
        run = run_command(self.argv, rule, self.cwd, None, subprocess.DEVNULL, setting)
        self.longest = max(self.longest, time.monotonic() - t0)
        self.interrupted = self.interrupted or run.interrupted
        return run, (None if run.interrupted else mean_step_s(run, RERUN_WARMUP, RERUN_STEPS))


def change(setting: dict[str, Any], asked: dict[str, Any], site: str) -> str:
    """The exact arguments to give the DataLoader, and where it is built."""
    args = ", ".join(f"{k}={v!r}" for k, v in setting.items() if asked.get(k) != v)
    return f"DataLoader(..., {args}) at {site}"
