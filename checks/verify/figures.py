"""Figures from the child's step records: pure functions, no torch (the parent and the tests use them).

A record is a ``checks.verify.contract.Step``: seconds of ``data_wait``, ``h2d``, ``forward``, ``backward``,
``optimizer`` on the device clock, host ``host_start``/``host_end``/``enqueue_s``, ``fetch`` windows and ``loss``.

Shares are of the total measured time (sums, not medians), so they add up to exactly 1 and match what an epoch
costs; with DataLoader workers the data wait comes in bursts (one slow batch in N), which a median would hide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks.verify.contract import PHASES, Step

SHARES = (*PHASES, "checkpoint")


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals (kernels on several streams)."""
    covered, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        covered += b - max(a, end)
        end = b
    return covered


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty sequence."""
    data = sorted(values)
    return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]


@dataclass(frozen=True)
class StepFigures:
    """The measured steps' figures; the judge adds the checkpoint amortised over its interval (``amortised``).

    ``step_s`` is the mean step with the checkpoint's share; the ``*_with_checkpoints`` rates are the headline:
    what training with a save every ``checkpoint_every_steps`` steps sustains.
    """

    steps: int
    median_s: float
    p95_s: float
    mean_s: float
    samples_per_s: float | None
    tokens_per_s: float | None
    phase_s: dict[str, float]
    shares: dict[str, float] = field(default_factory=dict)  # ``breakdown``: the checkpoint amortised in
    step_s: float = 0.0
    checkpoint_s_per_step: float = 0.0
    checkpoint_every_steps: int | None = None
    samples_per_s_with_checkpoints: float | None = None
    tokens_per_s_with_checkpoints: float | None = None


def step_figures(records: Sequence[Step], samples_per_step: int, tokens_per_sample: int = 0) -> StepFigures:
    """Median, p95 and mean step time, samples/s (and tokens/s), and seconds per phase summed."""
    totals = [r.total for r in records]
    spent = sum(totals)
    rate = samples_per_step * len(records) / spent if spent > 0 else None
    return StepFigures(
        steps=len(records),
        median_s=statistics.median(totals),
        p95_s=percentile(totals, 0.95),
        mean_s=spent / len(records),
        samples_per_s=rate,
        tokens_per_s=rate * tokens_per_sample if tokens_per_sample and rate else None,
        phase_s={p: sum(getattr(r, p) for r in records) for p in PHASES},
        shares=breakdown(records),
        step_s=spent / len(records),
    )


def breakdown(records: Sequence[Step], checkpoint_s_per_step: float = 0.0) -> dict[str, float]:
    """Each phase's share of the time per step, checkpoints amortised in; the shares add up to 1."""
    n = len(records)
    per_step = {p: sum(getattr(r, p) for r in records) / n for p in PHASES}
    per_step["checkpoint"] = checkpoint_s_per_step
    whole = sum(per_step.values())
    return {k: (v / whole if whole > 0 else 0.0) for k, v in per_step.items()}


def fetch_windows(records: Sequence[Step]) -> list[tuple[float, float]]:
    """Host windows spent blocked on the next batch (for CPU use while the loop waits for data)."""
    return [(a, b) for r in records for a, b in r.fetch]


def enqueue_ratio(records: Sequence[Step]) -> float | None:
    """Median of host time issuing a step / device time computing it (docs/sources.md#launch-bound-signals)."""
    ratios = [r.enqueue_s / c for r in records if (c := r.compute) > 0]
    return statistics.median(ratios) if ratios else None


def loss_trend(losses: Sequence[float]) -> dict[str, Any]:
    """First and last quarter means, whether every loss is finite, whether it went down."""
    finite = all(math.isfinite(v) for v in losses)
    k = max(1, len(losses) // 4)
    first = statistics.fmean(losses[:k]) if losses else math.nan
    last = statistics.fmean(losses[-k:]) if losses else math.nan
    return {
        "first": first if math.isfinite(first) else None,
        "last": last if math.isfinite(last) else None,
        "finite": finite and bool(losses),
        "decreasing": finite and len(losses) >= 2 and last < first,
    }


def knee_batch(rows: list[dict[str, Any]], knee: float) -> int | None:
    """Smallest batch reaching ``knee`` of the best throughput (docs/sources.md#batch-knee)."""
    done = [r for r in rows if r.get("samples_per_s")]
    if not done:
        return None
    best = max(r["samples_per_s"] for r in done)
    return min(r["batch"] for r in done if r["samples_per_s"] >= knee * best)


def largest_fit(fits: Callable[[int], bool], failed: int, probes: int = 3) -> int:
    """Largest batch below ``failed`` for which ``fits`` holds: halve until one fits, then bisect a little."""
    lo, hi, batch = 0, failed, failed // 2
    while batch >= 1 and not fits(batch):
        hi, batch = batch, batch // 2
    if batch < 1:
        return 0
    lo = batch
    for _ in range(probes):
        mid = (lo + hi) // 2
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
