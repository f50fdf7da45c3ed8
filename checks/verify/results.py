"""Results of a verify run that do not need the verdict rules: the loop, throughput, checkpoint, A/B, sweep;
and the text block that lists every verdict. Pure functions over the child's result (``contract.ChildResult``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from checks.config import VerifyConfig
from checks.result import Result, fail, ok, skip, warn
from checks.verify.contract import ChildResult
from checks.verify.diagnosis import Verdict
from checks.verify.events import Event, PhaseLine
from checks.verify.figures import StepFigures


def throughput(figs: StepFigures, cfg: VerifyConfig, command: bool = False) -> Result:
    """``verify-throughput``. The headline counts the checkpoint saves (one every ``checkpoint_every_steps``, at the
    measured save time): what a training run sustains. The training steps alone follow in brackets; the floor
    applies to the headline. A command's steps hold its own saves already (``command``)."""
    rate, floor = figs.samples_per_s_with_checkpoints or figs.samples_per_s or 0.0, cfg.min_samples_per_s
    tokens = figs.tokens_per_s_with_checkpoints or figs.tokens_per_s
    every = figs.checkpoint_every_steps
    headline = f"{rate:,.1f} samples/s{f', {tokens:,.0f} tokens/s' if tokens else ''}"
    if command:
        headline += " over the command's measured steps, whatever they held (its own saves too)"
    elif every:
        train = f"{figs.samples_per_s or 0:,.1f} samples/s" + (
            f", {figs.tokens_per_s:,.0f} tokens/s" if figs.tokens_per_s else ""
        )
        headline += f" with a checkpoint every {every} steps ({train} training only)"
    else:
        headline += " (no checkpoint timed)"
    summary = f"{headline} (floor: {f'{floor:g}' if floor else 'none'})"
    if floor and rate < floor:
        return fail("verify-throughput", summary, "below preflight.verify.min_samples_per_s: see diagnosis", value=rate)
    return ok("verify-throughput", summary, value=round(rate, 3))


def phases_result(events: Sequence[Event]) -> Result | None:
    """``verify-phases``: the parts the script marked as no training step (``phase("eval")``), rank 0's (or the
    only process's): how often, how long, and that the step time leaves them out; None without a phase."""
    by: dict[str, list[float]] = {}
    for e in events:
        if isinstance(e, PhaseLine) and e.lead:
            by.setdefault(e.name, []).append(e.seconds)
    if not by:
        return None
    parts = [f"{name} {len(s)}x, {sum(s):.2f} s ({sum(s) / len(s):.2f} s each)" for name, s in by.items()]
    summary = f"outside the steps (left out of the step time): {'; '.join(parts)}"
    return ok("verify-phases", summary, value={name: round(sum(s), 3) for name, s in by.items()})


def phase_spans(events: Sequence[Event]) -> dict[str, list[tuple[float, float]]]:
    """The timeline's shaded spans of the script's phases, rank 0's (or the only process's): each ``phase`` line
    is written at the phase's end, ``seconds`` after it began (the same host clock as the steps')."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if isinstance(e, PhaseLine) and e.lead:
            spans.setdefault(e.name, []).append((e.t - e.seconds, e.t))
    return spans


def sweep_result(r: ChildResult) -> Result:
    """``verify-sweep``: throughput per batch size and the knee (--sweep)."""
    s = r.sweep
    if not s:
        return skip("verify-sweep", "not asked (--sweep doubles the batch until OOM or the throughput knee)")
    if "skipped" in s:  # a command whose batch size verify cannot set
        return skip("verify-sweep", f"not run: {s['skipped']}")
    if "error" in s:
        return warn("verify-sweep", f"the sweep failed: {s['error']}", "the main figures stand; see the JSON report")
    parts = [_sweep_cell(row) for row in s["rows"]]
    knee = s.get("knee_batch")
    summary = f"knee at batch {knee}" if knee else "no batch size completed"
    return ok("verify-sweep", f"{summary} (samples/s by batch: {', '.join(parts)})", value=knee)


def _sweep_cell(row: dict[str, Any]) -> str:
    if row.get("oom"):
        return f"{row['batch']}: OOM"
    if row.get("error"):
        return f"{row['batch']}: {row['error']}"
    return f"{row['batch']}: {row['samples_per_s']:,.0f}/s"


def render_verdicts(verdicts: list[Verdict]) -> str:
    """Every verdict with severity, confidence, evidence and fix; the first is the diagnosis."""
    if not verdicts:
        return ""
    width = max(len(v.id) for v in verdicts)
    lines = ["", "diagnosis (primary first):"]
    for v in verdicts:
        lines.append(f"  {v.id:<{width}}  {v.severity:<8} {v.confidence:<6} {v.summary}")
        lines.append(f"  {'':<{width}}  fix: {v.fix}")
    return "\n".join(lines) + "\n"
