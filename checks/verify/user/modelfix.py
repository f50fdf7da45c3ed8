"""Measured model-side changes for a compute-bound command: re-run it with a change the agent makes to the model
the optimizer steps, and name a change only when it measured ``verify.advice_min_gain`` faster with the loss
agreeing.

The changes (``GPU_PREFLIGHT_MODEL``; the agent applies them at the first optimizer step to the outermost live
modules holding its parameters): ``bf16`` (``forward`` under ``torch.autocast(dtype=torch.bfloat16)``) where the
steps ran fp32 or tf32, on the CPU too; ``channels_last`` (weights and 4-D inputs) where those modules hold 4-D
weights (known from the first re-run's ``model-change`` line, or the main run's FLOP count of a convolution);
and with ``--ab`` ``compile`` (``Module.compile()``, given ``COMPILE_WARMUP`` warm-up steps for its compilation);
first of all ``fp32`` (the script's bf16 autocast regions turned off) where the measured run was bf16 on a CPU
without native bf16 (``checks/verify/user/cpuflags.py``): the cost of the emulation, measured.
Each re-run is the command stopped after its warm-up and ``RERUN_STEPS`` steps, output hidden; the comparison
is the mean step time of the measured steps against re-runs of the unchanged command timed the same way (one
before the changes, and one after them when a change measured anything: their mean, so a box that slows down or
speeds up during the re-runs does not make a change look better than it is). The measured run itself is not the
baseline: it was timed over more steps, with the sampler and FLOP count, and measured 30% apart from a re-run. The loss agrees when the mean of the first
steps' losses (both runs from step 1, as many as both have) differs by at most ``LOSS_TOLERANCE`` of the main
run's: a change that moves the numbers more is reported and never advised.

``measurements.model_advice``: ``baseline_mean_step_s``, ``baseline_runs``, ``candidates`` (``change``, ``ended``, ``mean_step_s``,
``speedup``, ``loss_agrees``, ``first_loss``, ``baseline_first_loss``, ``models``; or ``skipped``), ``min_gain``,
``faster`` (the best candidate that measured ``min_gain`` faster with the loss agreeing, or null), ``change`` (the
code to write), ``not_timed`` (changes that apply but were not timed: the budget, or compile without ``--ab``),
``seconds``, ``interrupted``.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from checks.verify.events import AutocastOff, ModelChange
from checks.verify.user import cpuflags
from checks.verify.user import judge as j
from checks.verify.user.launch import CommandRun, StopRule, run_command
from checks.verify.user.rerun import too_slow

RERUN_WARMUP = 2  # the first step is the unchanged model's (the change is made at the first optimizer step)
COMPILE_WARMUP = 4  # torch.compile compiles at the first call after the change: the steps that hold it
RERUN_STEPS = 8
LOSS_TOLERANCE = 0.1  # relative difference of the first steps' mean loss that still agrees. Tool-defined.
CHANGES: dict[str, dict[str, Any]] = {
    "bf16": {"autocast": "bf16"},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "fp32": {"autocast": "off"},
}
NO_CONV = "no 4-D weights (no convolution): channels_last changes nothing"
NO_AUTOCAST = "no bf16 autocast region was entered: the bf16 is the weights' own (model.to(torch.bfloat16))"
CODE = {
    "bf16": "with torch.autocast(device_type, dtype=torch.bfloat16): around the forward pass and the loss",
    "channels_last": "model.to(memory_format=torch.channels_last) and inputs .contiguous(memory_format=torch.channels_last)",
    "compile": "model = torch.compile(model) (or model.compile())",
    "fp32": "drop the bf16 autocast on this CPU, which emulates bf16 (no avx512_bf16 or amx_bf16): train in fp32",
}


def wanted(precision: str | None, ab: bool) -> list[str]:
    """The changes worth timing, most promising first: bf16 where the math ran fp32, channels_last, compile."""
    out = ["bf16"] if precision in (None, "fp32", "tf32") else []
    out.append("channels_last")
    return [*out, "compile"] if ab else out


def emulated_bf16(run: CommandRun) -> bool:
    """The measured run was bf16 on the CPU and this CPU lacks native bf16: its cost is worth an fp32 re-run."""
    lead = j.rerun_lead(run, 0, 10**9)
    if lead is None or (lead.device is not None and lead.device.type != "cpu"):
        return False
    precisions = [s.precision for s in lead.steps if s.precision]
    bf16 = bool(precisions) and max(set(precisions), key=precisions.count) == "bf16"
    return bf16 and cpuflags.read_native_bf16() is False


def first_losses(run: CommandRun) -> list[float]:
    """Rank 0's (or the only process's) losses from step 1, in order."""
    lead = j.rerun_lead(run, 0, 10**9)
    return [s.loss for s in (lead.steps if lead else []) if s.loss is not None]


def agrees(base: Sequence[float], other: Sequence[float]) -> tuple[bool, float | None, float | None]:
    """Whether the first steps' mean losses agree (and both means), over as many steps as both have."""
    n = min(len(base), len(other))
    if n == 0:
        return False, None, None
    a, b = statistics.fmean(base[:n]), statistics.fmean(other[:n])
    if not (math.isfinite(a) and math.isfinite(b)):
        return False, a, b
    return abs(b - a) <= LOSS_TOLERANCE * max(abs(a), 1e-12), a, b


def _row(change: str, run: CommandRun, warmup: int, base_losses: Sequence[float]) -> dict[str, Any]:
    row: dict[str, Any] = {"change": change, "ended": run.ended}
    if change == "fp32" and not any(isinstance(e, AutocastOff) for e in run.events):
        return row | {"skipped": NO_AUTOCAST}  # nothing was changed: its time says nothing about fp32
    applied = [e for e in run.events if isinstance(e, ModelChange)]
    if applied:
        row["models"] = list(applied[-1].models)
    step_s = _mean_step_s(run, warmup)
    if step_s:
        ok, a, b = agrees(base_losses, first_losses(run))
        row |= {"mean_step_s": round(step_s, 6), "loss_agrees": ok}
        row |= {"baseline_first_loss": a, "first_loss": b}
    return row


def _mean_step_s(run: CommandRun, warmup: int) -> float | None:
    lead = j.rerun_lead(run, warmup, RERUN_STEPS)
    figs = j.rank_figures(lead) if lead and len(lead.steps) >= RERUN_STEPS else None
    return figs.fig.mean_s if figs else None


def _conv(run: CommandRun) -> bool | None:
    """Whether the models hold 4-D weights, as the re-run's agent saw them (None: no change line)."""
    seen = [e for e in run.events if isinstance(e, ModelChange)]
    return seen[-1].conv if seen else None


def measure(
    argv: Sequence[str],
    cwd: str,
    changes: Sequence[str],
    base: CommandRun,
    budget_s: float,
    min_gain: float,
    step_s: float | None = None,
) -> dict[str, Any]:
    """``measurements.model_advice`` (see the module docstring); ``step_s``: the measured run's, to skip re-runs
    that cannot fit at its pace."""
    start, longest, conv = time.monotonic(), 0.0, None
    if "fp32" not in changes and emulated_bf16(base):
        changes = ["fp32", *changes]
    if slow := too_slow(step_s, RERUN_WARMUP + RERUN_STEPS, budget_s):
        return {
            "baseline_mean_step_s": None, "baseline_runs": 0, "min_gain": min_gain, "faster": None, "change": None,
            "candidates": [{"change": c, "skipped": slow} for c in changes],
            "not_timed": [c for c in CHANGES if _applies(c, changes, [])], "seconds": 0.0, "interrupted": False,
        }  # fmt: skip
    base_losses = first_losses(base)
    baselines: list[float] = []
    rows: list[dict[str, Any]] = []
    for change in ["", *changes, ""]:
        if change == "" and baselines and not any(r.get("speedup") for r in _rated(rows, baselines)):
            break  # the closing baseline only checks a measured change against drift
        if change == "channels_last" and conv is False:
            rows.append({"change": change, "skipped": NO_CONV})
            continue
        left = budget_s - (time.monotonic() - start)
        if left <= max(longest, 1.0):
            rows.append({"change": change or "none", "skipped": f"{left:.0f} s of verify.command_advice_s left"})
            continue
        warmup = COMPILE_WARMUP if change == "compile" else RERUN_WARMUP
        rule = StopRule(warmup, RERUN_STEPS, first_step_s=left, stall_s=left, limit_s=left)
        t0 = time.monotonic()
        run = run_command(argv, rule, cwd, None, subprocess.DEVNULL, model=CHANGES.get(change))
        longest = max(longest, time.monotonic() - t0)
        if run.interrupted:
            rows.append({"change": change or "none", "ended": "interrupted"})
            break
        if not change:
            step_s = _mean_step_s(run, warmup)
            baselines += [step_s] if step_s else []
            continue
        conv = _conv(run) if conv is None else conv
        if change == "channels_last" and conv is False:  # its own re-run found no 4-D weight: nothing changed
            rows.append({"change": change, "skipped": NO_CONV})
            continue
        rows.append(_row(change, run, warmup, base_losses))
    rows = _rated(rows, baselines)
    noise = _spread(baselines)
    faster = pick(rows, max(min_gain, noise))
    return {
        "baseline_mean_step_s": round(statistics.fmean(baselines), 6) if baselines else None,
        "baseline_runs": len(baselines),
        "candidates": rows,
        "min_gain": min_gain,
        "faster": faster,
        "change": CODE[faster["change"]] if faster else None,
        "not_timed": [
            c
            for c in CHANGES
            if c not in {r["change"] for r in rows if "mean_step_s" in r} and _applies(c, changes, rows)
        ],
        "seconds": round(time.monotonic() - start, 1),
        "interrupted": any(r.get("ended") == "interrupted" for r in rows),
        "spread": round(noise, 3),
        "not_measurable": (
            f"re-runs of the unchanged command differed by {noise:.0%} (other processes on the box?), more than the "
            f"{min_gain:.0%} a change must gain"
            if faster is None and noise >= min_gain
            else None
        ),
    }


def _spread(values: Sequence[float]) -> float:
    """(max - min) / mean of the unchanged command's re-runs (0 with fewer than two): a gain must beat it."""
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) >= 2 else 0.0


def pick(rows: Sequence[dict[str, Any]], min_gain: float) -> dict[str, Any] | None:
    """The fastest change that measured ``min_gain`` faster with the loss agreeing (a faster change that moved
    the loss is never the one advised)."""
    good = [r for r in rows if r.get("speedup") and r.get("loss_agrees")]
    best = max(good, key=lambda r: r["speedup"], default=None)
    return best if best and best["speedup"] >= 1 + min_gain else None


def _applies(change: str, asked: Sequence[str], rows: Sequence[dict[str, Any]]) -> bool:
    """A change worth naming untimed: asked but not timed (the budget, an interrupt), or compile without --ab; not
    bf16 for a run already in 16 bits, not channels_last without 4-D weights, not fp32 without a bf16 autocast."""
    if change == "compile":
        return True
    skipped = next((r.get("skipped", "") for r in rows if r["change"] == change), "")
    return change in asked and not skipped.startswith((NO_CONV, NO_AUTOCAST))


def _rated(rows: list[dict[str, Any]], baselines: Sequence[float]) -> list[dict[str, Any]]:
    """Each timed change's speed-up over the unchanged re-runs (their mean: one before the changes, one after)."""
    if not baselines:
        return rows
    base = statistics.fmean(baselines)
    return [r | {"speedup": round(base / r["mean_step_s"], 3)} if r.get("mean_step_s") else r for r in rows]
