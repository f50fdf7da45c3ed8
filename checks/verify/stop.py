"""When verify has measured enough: the one stop rule of every run (``checks/verify/user/launch.py`` applies it).

Standard library only (the training child and the parent both use it).

**The rule.** Measured steps run until, after at least ``min_steps`` of them, every share of the step (data wait,
host-to-device, forward, backward, optimizer) is known to within ``width``: the measured steps are cut into
``batches`` consecutive groups of equal size (the oldest left-over steps dropped), each group's share is its phase
time over its step time, and the share's 95% confidence half-width is Student's t (``batches`` - 1 degrees of
freedom) times the standard deviation of the group shares over the square root of ``batches`` (the method of
batch means: consecutive steps are correlated, group means much less). A cap (``verify.steps``) and the
whole command's budget end the steps earlier or later than that, whichever comes first; never before
``MIN_MEASURED`` steps.

**The budget.** ``verify.budget`` (``--budget``) is wall seconds for the whole command. After the warm-up the child
knows a step's time (the median warm-up step after the first, which includes start-up) and keeps, of the time
left, what the phases after the measured steps need (``rest_s``: the checkpoint round trip, the kernel profile,
the loader probe when the warm-up waited for data); the measured steps get the remainder. The asked extras
(``--sweep``, ``--ab``) and the loader probe run on what is left then; what did not fit is a ``Cut`` naming the
flag that gets it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from checks.verify.contract import PHASES, Cut, StopFacts

MIN_MEASURED = 8  # the measured steps a budget leaves when its steps fit (fewer than critical_min_steps cap at warn)
# When the warm-up's pace shows that not even MIN_MEASURED steps fit the time left (a slow or crowded box), the
# budget still ends the measured steps once this many are in: a verdict on fewer steps, said so, at low
# confidence, beats one that comes minutes late or a timeout that discards the steps. Tool-defined.
MIN_UNDER_PRESSURE = 3
TAIL_S = 4.0  # the parent's work after the child (judging, the CSV, the PNG timeline): ~2 s measured here, x2
# Under a budget the warm-up ends once it has used this share of the time left when it began, after at least
# MIN_WARMUP steps (the first holds the start-up, the pace is the median of the rest): a 7 s step has settled by
# its third, and the seconds it saves buy measured steps. Tool-defined.
WARMUP_SHARE = 1 / 6
MIN_WARMUP = 3
CKPT_FIXED_S = 2.0  # the round trip beyond its steps: save, a fresh model and optimizer, load (small models)
COMPILE_S = 30.0  # torch.compile's first steps of a small model on two CPU cores (--ab), tool-defined
# Student's t, two-sided 95%, by degrees of freedom (any statistics table).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def rows_of(steps: Sequence[Any]) -> list[list[float]]:
    """Seconds per phase of each step: ``Step`` records or the agent's step lines (``checks.verify.events``)."""
    return [[float(getattr(s, p)) for p in PHASES] for s in steps]


def half_widths(rows: Sequence[Sequence[float]], batches: int) -> dict[str, float] | None:
    """Each share's 95% confidence half-width from ``batches`` batch means; None with fewer steps than batches."""
    if batches < 2 or len(rows) < batches:
        return None
    size = len(rows) // batches
    kept = rows[len(rows) - size * batches :]
    groups = [kept[i * size : (i + 1) * size] for i in range(batches)]
    totals = [sum(sum(r) for r in g) for g in groups]
    if any(t <= 0 for t in totals):
        return None
    t = _T975.get(batches - 1, 1.96)
    out = {}
    for k, phase in enumerate(PHASES):
        shares = [sum(r[k] for r in g) / total for g, total in zip(groups, totals, strict=True)]
        out[phase] = round(t * statistics.stdev(shares) / math.sqrt(batches), 4)
    return out


def stable(rows: Sequence[Sequence[float]], min_steps: int, width: float, batches: int) -> bool:
    """At least ``min_steps`` measured and every share's half-width within ``width``."""
    if len(rows) < min_steps:
        return False
    found = half_widths(rows, batches)
    return found is not None and max(found.values()) <= width


def counts(asked: int, min_steps: int, step_s: float, seconds: float) -> tuple[int, int]:
    """(least, most) measured steps: ``asked`` at most, what ``seconds`` hold at ``step_s`` a step, at least
    ``MIN_UNDER_PRESSURE`` (or ``asked`` when fewer); the stability rule is not checked before ``least``."""
    most = asked
    if math.isfinite(seconds) and step_s > 0:
        most = min(asked, max(MIN_UNDER_PRESSURE, int(max(seconds, 0.0) / step_s)))
    return min(min_steps, most), most


def more_budget(budget_s: float, short_s: float) -> int:
    """A ``--budget`` that would have held what ``short_s`` more seconds needed (up to the next 10 s)."""
    return int(math.ceil((budget_s + max(short_s, 1.0)) / 10.0) * 10)


def measure_cut(facts: StopFacts, budget_s: float) -> Cut | None:
    """The cut of the measured steps themselves, when the budget ended them before the cap."""
    if facts.reason != "budget" or facts.warm_step_s is None:
        return None
    short = (facts.asked - facts.measured) * facts.warm_step_s
    return Cut(
        "measure",
        f"{facts.measured} of at most {facts.asked} steps measured at {facts.warm_step_s:.2f} s a step",
        f"--budget {more_budget(budget_s, short)} or --steps {facts.asked}",
    )


# How a command's measured steps ended when verify did not stop them (``StopFacts.reason``).
ENDED = {
    "exited": "the command ended by itself",
    "crashed": "then the command crashed",
    "interrupted": "then Ctrl-C",
    "stalled": "then no step came (stopped by verify)",
    "limit": "then the time limit",
}


def describe(facts: StopFacts) -> str:
    """How the measured steps ended, for the report's row."""
    widest = max((facts.half_width or {}).values(), default=None)
    within = f"every share within ±{100 * widest:.1f} points (95%)" if widest is not None else "too few to tell"
    if facts.reason == "stable":
        return f"stopped at {facts.measured} steps: {within}, verify.stable_width {100 * facts.width:g}"
    if facts.reason == "forced":
        return f"{facts.measured} steps, as asked ({within})"
    if facts.reason in ENDED:
        return f"{facts.measured} steps: {ENDED[facts.reason]} ({within})"
    if facts.reason == "budget":
        few = (
            f"; fewer than the {MIN_MEASURED} a settled verdict takes: low confidence"
            if facts.measured < min(MIN_MEASURED, facts.asked)
            else ""
        )
        return f"{facts.measured} step{'' if facts.measured == 1 else 's'}: the budget held no more ({within}){few}"
    return f"{facts.measured} steps, the cap verify.steps ({within})"


def time_to_verdict(
    budget_s: float, seconds: float, facts: StopFacts | None, cuts: Sequence[Cut], estimate_s: float | None = None
) -> dict[str, Any]:
    """``measurements.time_to_verdict``: the budget, the whole command's seconds, how the steps ended, the cuts."""
    return {
        "budget_s": budget_s,
        "seconds": round(seconds, 1),
        "within_budget": seconds <= budget_s,
        "estimate_s": None if estimate_s is None else round(estimate_s, 1),
        "stop": None if facts is None else facts.to_json(),
        "cuts": [c.to_json() for c in cuts],
    }


def summary(budget_s: float, seconds: float, facts: StopFacts | None, cuts: Sequence[Cut]) -> str:
    """The ``verify-time`` row: the verdict's time against the budget, how the steps ended, what was cut."""
    over = "" if seconds <= budget_s else " (over: the fewest steps a verdict needs took longer)"
    text = f"verdict in {seconds:.0f} s of the {budget_s:g} s budget{over}"
    if facts is not None:
        text += f"; {describe(facts)}"
    for c in cuts:
        text += f"; cut: {c.summary} ({c.fix} gets it all)"
    return text
