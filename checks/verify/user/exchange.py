"""The exposed gradient exchange of a command under torchrun, measured by A/B: re-runs of the unchanged command
alternated with re-runs whose exchange is skipped.

The agent's comm hook times the exchange from the last gradient bucket handed to the all-reduce to the end of
backward; a bucket that blocks earlier (gloo's all-reduce runs on the rank's own thread, a slow link stalls the
queue) is not in that window (reported on another box: 7-27 ms there against about 29 ms by an A/B of the same
script; on this project's 2-core box the two agreed within 1 ms, docs/verify.md). So the figure judged is the A/B's: with ``GPU_PREFLIGHT_DDP=skip`` the agent's hook hands
every bucket back unreduced (no all-reduce at all; the ranks' weights drift apart, which a few timed steps do not
mind), and the exchange the step waits for is the unchanged re-runs' mean step minus the skipped ones'. The legs
alternate, unchanged first (unchanged, skipped, unchanged, skipped), so that a box that slows down during them
does not favour one; each is the command stopped after ``RERUN_WARMUP`` and ``RERUN_STEPS`` steps, output hidden,
timed on rank 0 (DDP paces every rank to the slowest). The re-runs stay within their share of the budget: a leg
is started only when the time left covers the longest re-run so far; with fewer than one run of each leg there
is no A/B, and the hook's figure stands.

``measurements.ddp.ab`` (``CommFigures``): ``windows`` (runs per leg), ``window_steps``, ``sync_median_s`` and
``no_sync_median_s`` (each leg's mean step over its runs), ``sync_spread_s`` and ``no_sync_spread_s`` (max - min
of each leg's runs), ``tolerance`` and ``agreed``: the A/B's figure replaces the hook's only where each leg ran
twice or more and both spreads add up to at most ``verify.exchange_ab_tolerance`` of the unchanged step (one
repeat on a loaded box read 16 ms against the hook's 77 ms); else ``noise`` says why it is too noisy to call.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from checks.reports.verify import CommFigures
from checks.verify.events import DdpSkipped
from checks.verify.user import judge as j
from checks.verify.user.launch import StopRule, run_command

RERUN_WARMUP = 2  # the first step holds start-up and the process group's rendezvous
RERUN_STEPS = 8
LEGS = ("", "skip", "", "skip")  # alternated, unchanged first


def measure(argv: Sequence[str], cwd: str, budget_s: float) -> dict[str, Any]:
    """Each leg's mean step per run (``sync``: unchanged, ``skip``: no exchange), the seconds taken, and whether
    Ctrl-C ended it; ``CommFigures`` of them by ``figures``."""
    start, longest = time.monotonic(), 0.0
    legs: dict[str, list[float]] = {"sync": [], "skip": []}
    interrupted, skipped = False, 0
    for leg in LEGS:
        left = budget_s - (time.monotonic() - start)
        if left <= max(longest, 1.0):
            skipped += 1
            continue
        rule = StopRule(RERUN_WARMUP, RERUN_STEPS, first_step_s=left, stall_s=left, limit_s=left)
        t0 = time.monotonic()
        run = run_command(argv, rule, cwd, None, subprocess.DEVNULL, ddp=leg)
        longest = max(longest, time.monotonic() - t0)
        if run.interrupted:
            interrupted = True
            break
        lead = j.rerun_lead(run, RERUN_WARMUP, RERUN_STEPS)
        figs = j.rank_figures(lead) if lead is not None and len(lead.steps) >= RERUN_STEPS else None
        applied = any(isinstance(e, DdpSkipped) for e in run.events)
        if figs is not None and (leg == "") != applied:  # a skip leg whose exchange was not skipped is no leg
            legs["skip" if leg else "sync"].append(figs.fig.mean_s)
    return {
        "sync": [round(x, 6) for x in legs["sync"]],
        "skip": [round(x, 6) for x in legs["skip"]],
        "not_run": skipped,
        "seconds": round(time.monotonic() - start, 1),
        "interrupted": interrupted,
    }


def figures(ab: dict[str, Any], tolerance: float) -> CommFigures | None:
    """The A/B as ``measurements.ddp.ab``; None without a run of each leg. ``agreed`` only where ``noise`` finds
    the repeats within ``tolerance`` (``verify.exchange_ab_tolerance``)."""
    sync, skip = ab.get("sync") or [], ab.get("skip") or []
    if not sync or not skip:
        return None
    figs = CommFigures(
        windows=min(len(sync), len(skip)),
        window_steps=RERUN_STEPS,
        sync_median_s=round(statistics.fmean(sync), 6),
        no_sync_median_s=round(statistics.fmean(skip), 6),
        sync_spread_s=round(_spread(sync), 6),
        no_sync_spread_s=round(_spread(skip), 6),
        tolerance=tolerance,
    )
    said = noise(sync, skip, tolerance)
    return dataclasses.replace(figs, agreed=said is None, noise=said)


def noise(sync: Sequence[float], skip: Sequence[float], tolerance: float) -> str | None:
    """Why the A/B is too noisy to call (None: its repeats agree): fewer than two runs of a leg (no spread to
    judge it by), or the legs' spreads adding up to more than ``tolerance`` of the unchanged step, the most the
    difference of their means may be off by."""
    if len(sync) < 2 or len(skip) < 2:
        runs = f"{len(sync)} unchanged and {len(skip)} skipped run(s)"
        return f"too noisy to call: {runs}, and one run of a leg does not show how far its repeats agree"
    step = statistics.fmean(sync)
    spread = _spread(sync) + _spread(skip)
    if step > 0 and spread <= tolerance * step:
        return None
    return (
        f"too noisy to call: the repeats of each leg differ by {1000 * _spread(sync):.1f} ms (unchanged) and "
        f"{1000 * _spread(skip):.1f} ms (skipped), {100 * spread / step if step > 0 else 100:.0f}% of the "
        f"{1000 * step:.1f} ms step, over the {100 * tolerance:.0f}% they must agree within "
        "(verify.exchange_ab_tolerance)"
    )


def _spread(values: Sequence[float]) -> float:
    return max(values) - min(values) if values else 0.0
