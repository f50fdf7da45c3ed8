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

Fewer workers are tried too where they can win: one per usable core when the loader has more workers than that (on
a box with few cores the extra workers only split it), and ``num_workers=0`` when each step waited at least as
long as its batches took the workers to make (``measurements.item_cost``: then the hand-off, pickling each batch
across processes, is what the loop waits for, and the training process would build them in less).

Workers start making batches as soon as the loader's iterator exists, while the script is still starting: up to
``num_workers x prefetch_factor`` batches wait in the queue when the first step asks. A short re-run that reads
them times batches made before it (16 workers with prefetch 4 on 2 cores once "measured" 5.71x, more than the
cores can make). So a re-run leaves out one step more for each batch queued that way (``rerun_warmup``), and its
mean step is capped by what its workers made during the measured steps (their ``fetch`` lines: one per batch,
written where it was made): where they made batches slower than the steps consumed them, the steps were reading
the queue down, and the step time their pace sustains (``workers_step_s``) is the re-run's (``capped_from_s``: the
steps' own mean). Where the workers keep up, they make a batch for each one taken, at the steps' pace: nothing is
capped. With the cap alone (2 steps left out), unchanged re-runs of 10 ms-a-sample batches through eight workers
read 60-71 ms a step where 2 cores make one in no less than 80 ms: all their steps read the queue.

For the tool's own script (``invoke verify`` without ``--``) a change is its flag, ``--workers N``: its other
loader settings follow from it (``persistent_workers`` with workers, ``pin_memory`` on a GPU), and it has no
prefetch flag, so no prefetch is timed.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from checks.verify.events import FetchLine
from checks.verify.user import judge as j
from checks.verify.user.itemcost import worker_batches
from checks.verify.user.launch import CommandRun, StopRule, run_command
from checks.verify.user.rerun import too_slow

RERUN_WARMUP = 2  # the first step holds start-up; the second the workers' first batches (and see rerun_warmup)
RERUN_STEPS = 8
MIN_MADE = 4  # the fewest batches made during the measured steps to time the workers' pace by


def candidates(
    asked: dict[str, Any], cores: float, cuda: bool, item: dict[str, Any] | None = None, wait_s: float = 0.0,
    flag: str = "",
) -> list[dict[str, Any]]:  # fmt: skip
    """Settings worth timing against the loader's own, most promising first: fewer workers where the loader has
    more than the cores or the hand-off is the wait (``fewer``), then more workers, kept alive, and (not with a
    ``flag``: the tool's script has no prefetch flag) more prefetch."""
    current = int(asked.get("num_workers") or 0)
    usable = max(1, int(cores))
    more = sorted({c for c in (usable, max(1, 2 * current), current + 1) if c > current}, reverse=True)[:2]
    out = [workers(count, cuda) for count in (*fewer(current, usable, item, wait_s), *more)]
    if more and not flag:
        out.append({**workers(more[0], cuda), "prefetch_factor": 4})
    return out


def workers(count: int, cuda: bool) -> dict[str, Any]:
    """The loader with ``count`` workers, kept alive between epochs, pinned on a GPU (templates/train.py's own)."""
    setting: dict[str, Any] = {"num_workers": count, "persistent_workers": count > 0}
    return setting | ({"pin_memory": True} if cuda else {})


def fewer(current: int, usable: int, item: dict[str, Any] | None, wait_s: float) -> list[int]:
    """Fewer workers worth timing: one per usable core where there are more workers than cores, and none where a
    step waited at least as long as its batches took to make (the hand-off, not the making, is the wait)."""
    cost = item or {}
    made_ms = cost.get("getitem_ms_per_step")
    if cost.get("where") == "workers" and made_ms is not None:
        made_ms += cost.get("collate_ms_per_step") or 0.0
    handoff = current > 0 and made_ms is not None and cost.get("where") == "workers" and wait_s * 1e3 >= made_ms
    return ([usable] if current > usable else []) + ([0] if handoff else [])


def rerun_warmup(loader: dict[str, Any]) -> int:
    """The steps a re-run of ``loader`` (the asked settings with a candidate's over them) leaves out before its
    measured ones: ``RERUN_WARMUP``, plus one a batch its workers queue while the script starts (``num_workers x
    prefetch_factor``, 2 by default). Steps that read those time batches made before them; a step takes one batch
    or more, so by then the queue is spent."""
    count = int(loader.get("num_workers") or 0)
    return RERUN_WARMUP + (count * int(loader.get("prefetch_factor") or 2) if count else 0)


def workers_pace(lead: j.Rank, made: Sequence[FetchLine]) -> float | None:
    """The step time the workers' batches made during ``lead``'s measured steps sustain (``made``: their
    ``fetch`` lines), at its batches a step; None without workers' lines. The slower of two readings:

    - their rate: from the first made to the last; with fewer than ``MIN_MADE`` made, at most one more than those
      in the whole of the steps' time (its least);
    - their making: the median time a worker took to build one (its samples' ``__getitem__`` and collate, on the
      worker's clock, sharing the cores) over the workers building at once. Workers that started together finish
      together, so their batches come in bursts: eight workers on 2 cores made eight batches within milliseconds
      every ~640 ms, and the rate over 8 steps read faster than the cores allow."""
    if not made:
        return None
    lo, hi = lead.steps[0].host_start, lead.steps[-1].host_end
    during = [e for e in made if lo <= e.t <= hi]
    inside = sorted(e.t for e in during)
    per_step = statistics.median(s.batches for s in lead.steps) or 1
    if len(inside) < MIN_MADE or inside[-1] <= inside[0]:
        rate = per_step * (hi - lo) / (len(inside) + 1)
    else:
        rate = per_step * (inside[-1] - inside[0]) / (len(inside) - 1)
    built = during or [e for e in made if e.t >= lo] or list(made)
    making = statistics.median(e.getitem_s + e.collate_s for e in built) / max(1, max(e.workers for e in built))
    return max(rate, per_step * making)


@dataclasses.dataclass(frozen=True)
class Steady:
    """A re-run's mean step time (capped by its workers' pace where the steps read the queue down)."""

    step_s: float | None
    workers_step_s: float | None = None
    capped_from_s: float | None = None  # the steps' own mean, where the workers' pace capped it


def steady(run: CommandRun, warmup: int, steps: int) -> Steady:
    """A re-run's mean step time over its measured steps, capped by its workers' pace (``workers_pace``) where
    that is slower: no loop runs faster than its batches are made."""
    lead = j.rerun_lead(run, warmup, steps)
    figs = j.rank_figures(lead) if lead else None
    if lead is None or figs is None:
        return Steady(None)
    mean = figs.fig.mean_s
    pace = workers_pace(lead, worker_batches(lead, run.events))
    if pace is not None and pace > mean:
        return Steady(pace, pace, mean)
    return Steady(mean, pace)


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
    *,
    item: dict[str, Any] | None = None,
    wait_s: float = 0.0,
    flag: str = "",
) -> dict[str, Any]:
    """``measurements.command_advice``: the baseline re-runs and their spread, each candidate's mean step time and
    speed-up over them, and the change to make (or none, or that none is measurable here). ``base_step_s`` (the
    measured run's) is the baseline only when no re-run of the unchanged command fit the budget. ``item`` (the
    measured run's ``item_cost``) and ``wait_s`` (its mean data wait a step) say whether fewer workers are worth
    timing; ``flag``: the command's own flag that sets the workers (the tool's script: ``--workers``)."""
    start = time.monotonic()
    tried = candidates(asked, cores, cuda, item, wait_s, flag)
    if slow := too_slow(base_step_s, rerun_warmup(asked) + RERUN_STEPS, budget_s):
        unrun = [{"overrides": setting, "skipped": slow} for setting in tried]
        none: dict[str, Any] = {"baseline_mean_step_s": round(base_step_s, 6), "baseline_runs": [], "spread": 0.0}
        none |= {"site": site, "candidates": unrun, "min_gain": min_gain, "faster": None, "change": None}
        return none | {"not_measurable": slow, "seconds": 0.0, "interrupted": False}
    timer = _Runs(argv, cwd, asked, budget_s, start)
    baselines: list[float] = []
    rows: list[dict[str, Any]] = []
    first = timer.run(None)
    if first is not None and first[1]:
        baselines.append(first[1])
    for setting in tried:
        if timer.interrupted:
            break
        done = timer.run(setting)
        if done is None:
            rows.append({"overrides": setting, "skipped": f"{timer.left():.0f} s of verify.command_advice_s left"})
            continue
        run, step_s = done
        row: dict[str, Any] = {"overrides": setting, "ended": run.ended, "processes_left": run.left}
        if timer.last.workers_step_s is not None:
            row["workers_step_s"] = round(timer.last.workers_step_s, 6)
        if timer.last.capped_from_s is not None:
            row["capped_from_s"] = round(timer.last.capped_from_s, 6)
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
    base = round(statistics.fmean(baselines) if baselines else base_step_s, 6)  # as the report holds it
    for r in rows:
        if r.get("mean_step_s"):
            r["speedup"] = round(base / r["mean_step_s"], 3)
    noise = spread(baselines)
    best = max((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"], default=None)
    faster = best if best and best["speedup"] >= 1 + max(min_gain, noise) else None
    out: dict[str, Any] = {"baseline_mean_step_s": round(base, 6), "baseline_runs": [round(b, 6) for b in baselines]}
    out |= {"spread": round(noise, 3), "site": site, "candidates": rows, "min_gain": min_gain, "faster": faster}
    out["change"] = change(faster["overrides"], asked, site, flag) if faster else None
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

    def __init__(self, argv: Sequence[str], cwd: str, asked: dict[str, Any], budget_s: float, start: float) -> None:
        self.argv, self.cwd, self.asked, self.budget_s, self.start = argv, cwd, asked, budget_s, start
        self.longest, self.interrupted = 0.0, False
        self.last = Steady(None)  # the last run's timing

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def run(self, setting: dict[str, Any] | None) -> tuple[CommandRun, float | None] | None:
        left = self.left()
        if self.interrupted or left <= max(self.longest, 1.0):
            return None
        warmup = rerun_warmup(self.asked | (setting or {}))
        rule = StopRule(warmup, RERUN_STEPS, first_step_s=left, stall_s=left, limit_s=left)
        t0 = time.monotonic()
        run = run_command(self.argv, rule, self.cwd, None, subprocess.DEVNULL, setting)
        self.longest = max(self.longest, time.monotonic() - t0)
        self.interrupted = self.interrupted or run.interrupted
        self.last = Steady(None) if run.interrupted else steady(run, warmup, RERUN_STEPS)
        return run, self.last.step_s


def change(setting: dict[str, Any], asked: dict[str, Any], site: str, flag: str = "") -> str:
    """The exact arguments to give the DataLoader, and where it is built; with ``flag`` (the command's own flag
    for the workers: the tool's script's ``--workers``), that flag and the count."""
    if flag:
        return f"{flag} {setting['num_workers']}"
    args = ", ".join(f"{k}={v!r}" for k, v in setting.items() if asked.get(k) != v)
    return f"DataLoader(..., {args}) at {site}"
