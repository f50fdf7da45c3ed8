"""Measured DataLoader advice for the user's own command: re-run it briefly with candidate settings, name one
only when it measured ``advice_min_gain`` faster.

The agent applies the candidate at construction (``DataLoader.__init__``: ``num_workers``, ``persistent_workers``,
``prefetch_factor``, ``pin_memory`` on a GPU) to every loader the command builds. Each re-run is the same command
stopped after a short warm-up and a few steps; the comparison is the mean step time of the measured steps (sums,
as the breakdown: bursty waits with workers would hide in a median). The first run is the baseline. All re-runs
together stay within ``verify.command_advice_s``: a candidate is started only when the time left covers the
longest run so far, and it is stopped when the time is up.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from typing import Any

from checks.verify.user import judge as j
from checks.verify.user.launch import CommandRun, StopRule, run_command

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
    """``measurements.advice``: each candidate's mean step time and speed-up, and the change to make (or none)."""
    start, longest = time.monotonic(), 0.0
    rows: list[dict[str, Any]] = []
    for setting in candidates(asked, cores, cuda):
        left = budget_s - (time.monotonic() - start)
        if left <= max(longest, 1.0):
            rows.append({"overrides": setting, "skipped": f"{left:.0f} s of verify.command_advice_s left"})
            continue
        rule = StopRule(RERUN_WARMUP, RERUN_STEPS, first_step_s=left, stall_s=left, limit_s=left)
        t0 = time.monotonic()
        run = run_command(argv, rule, cwd, None, subprocess.DEVNULL, setting)
        longest = max(longest, time.monotonic() - t0)
        if run.interrupted:
            rows.append({"overrides": setting, "ended": "interrupted"})
            break
        step_s = mean_step_s(run, RERUN_WARMUP, RERUN_STEPS)
        row: dict[str, Any] = {"overrides": setting, "ended": run.ended, "processes_left": run.left}
        if step_s:
            row |= {"mean_step_s": round(step_s, 6), "speedup": round(base_step_s / step_s, 3)}
        rows.append(row)
    best = max((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"], default=None)
    faster = best if best and best["speedup"] >= 1 + min_gain else None
    out: dict[str, Any] = {"baseline_mean_step_s": round(base_step_s, 6), "site": site, "candidates": rows}
    out["min_gain"] = min_gain
    out["faster"] = faster
    out["change"] = change(faster["overrides"], asked, site) if faster else None
    out["seconds"] = round(time.monotonic() - start, 1)
    out["interrupted"] = any(r.get("ended") == "interrupted" for r in rows)
    return out


def change(setting: dict[str, Any], asked: dict[str, Any], site: str) -> str:
    """The exact arguments to give the DataLoader, and where it is built."""
    args = ", ".join(f"{k}={v!r}" for k, v in setting.items() if asked.get(k) != v)
    return f"DataLoader(..., {args}) at {site}"
