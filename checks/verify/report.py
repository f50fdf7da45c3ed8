"""Judge a verify run: the child's measurements and the sampler's trace become results, verdicts and figures.

Result ids (after bootstrap's own): ``verify-data``, ``verify-loop``, ``verify-throughput``, ``verify-loss``,
``verify-checkpoint``, ``verify-data-resume``, ``verify-mfu``, ``verify-sampler``, ``diagnosis`` (value: the verdict
id, see ``checks/verify/diagnosis.py``), ``upgrade-estimate``, ``verify-cost``, ``verify-sweep``, ``verify-phases``
(a command's ``phase()`` marks, ``checks/verify/results.py``).
The gate fails (exit 1) on a failed check, a run that did not complete, NaN/inf or a loss that does not go down,
a checkpoint that does not reproduce, or throughput under the floor.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks.reports.verify import Files, Mfu
from checks.result import Result, ok, skip, warn
from checks.tables import datasheet
from checks.units import percent
from checks.verify import distributed
from checks.verify.contract import ChildResult
from checks.verify.cost import cost, describe
from checks.verify.diagnosis import Signals, Verdict, upgrade_bound
from checks.verify.figures import StepFigures, fetch_windows
from checks.verify.plan import Outcome
from checks.verify.sampler import Trace, gpu_summary, overlap_mean, summarise

# cant-tell is a warn: a run that could not be judged has not cleared the box, so the call to action is its fix.
TIME_VERDICT_STATUS = {"compute-bound": "ok"}


@dataclass(frozen=True)
class Setting:
    """What the judge reads besides the run's own figures: the box, the settings the run was given, where the
    files go; ``checks.verify.user.run`` builds one for every run from the box and the flags."""

    usable_cores: float
    files: Files
    price_per_hour: float = 0.0
    loader: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the DataLoader settings asked
    ckpt_every: int = 0  # the real run's save interval, to amortise a timed save over (0: saves count as they happen)
    epoch_samples: int | None = None  # staged data's samples: the epoch that ``verify-cost`` prices
    own_code: bool = False  # the step runs the user's model or data (their code, their copies)
    # the parent's NVML order (index -> UUID): a rank's GPU is named by the NVML index its UUID maps to (gpuN)
    nvml_uuids: Mapping[int, str | None] = dataclasses.field(default_factory=dict)


def mfu(r: ChildResult, median_s: float) -> Mfu:
    """Model FLOPs utilisation against the dense datasheet peak of this exact card and dtype; never a fallback."""
    device = r.device
    if device is None or device.type != "cuda":
        return Mfu(None, "no GPU: MFU needs a GPU and its datasheet peak", None)
    spec = datasheet.lookup(device.name or "")
    if spec is None:
        note = f"MFU unknown: {device.name} is not in templates/gpus.yaml (no other card's peak is used)"
        return Mfu(None, note, None)
    if r.precision is None:  # a command whose steps showed no autocast region and no optimizer weights
        why = r.flops_note if not r.flops_per_step else "the step's precision was not seen (no autocast, no weights)"
        return Mfu(None, f"MFU unknown: {why or 'no FLOP count'}", None)
    # Dense fp16 with fp32 accumulate runs at the bf16 rate from sm_80 on (templates/gpus.yaml lists fp16 below).
    peak = {"bf16": spec.bf16_tflops, "fp16": spec.fp16_tflops or spec.bf16_tflops}.get(r.precision)
    if peak is None:
        return Mfu(None, f"MFU unknown: no {r.precision} peak for {spec.model} in the table (bf16/fp16 only)", None)
    if not r.flops_per_step:
        return Mfu(None, f"MFU unknown: {r.flops_note or 'no FLOP count'}", peak)
    return Mfu(
        r.flops_per_step / median_s / (peak * 1e12), f"{spec.model} dense {r.precision} peak {peak:g} TFLOPS", peak
    )


def signals(p: Setting, o: Outcome, figures: StepFigures, gate: Sequence[Result] | None = None) -> Signals:
    """Assemble what the verdict rules read from the child's result, the trace of the measured window and the
    gate's rows (bootstrap's fast checks; None where they did not run)."""
    r = o.child.result or ChildResult()
    window = r.timeline.get("measure")
    trace = o.trace.within(*window) if window else o.trace
    waits = fetch_windows(r.steps)
    tree = overlap_mean(trace, "tree_cpu_cores", waits) if waits else None
    machine = overlap_mean(trace, "cpu_pct", waits) if waits else None
    ckpt = r.checkpoint
    return Signals(
        steps=len(r.steps),
        device=r.device.type if r.device else "cpu",
        shares=figures.shares,
        step_s=figures.step_s,
        workers=int((r.loader or p.loader).get("num_workers") or 0),
        usable_cores=p.usable_cores,
        cpu_during_wait=None if tree is None else tree / p.usable_cores,
        machine_cpu_during_wait=None if machine is None else machine / 100,
        iowait_during_wait=overlap_mean(trace, "iowait_pct", waits) if waits else None,
        kernels=None if "error" in (r.kernels or {}) else r.kernels,
        memory=r.memory,
        gpu=gpu_summary(trace, o.gpu_index) if o.gpu_index is not None else None,
        checkpoint={"save_s": ckpt.save_s, "bytes": ckpt.bytes, "every_steps": p.ckpt_every}
        if ckpt is not None and ckpt.save_s is not None
        else None,
        oom=r.oom.to_json() if r.oom else None,
        precision=r.precision or "fp32",
        machine_cpu=_median(trace.values("cpu_pct"), 100.0),
        tree_cpu=_median(trace.values("tree_cpu_cores"), p.usable_cores),
        sampler_coverage=coverage(trace, window),
        ddp=distributed.figures(r),
        gate=None if gate is None else tuple(gate),
        own_code=p.own_code,
    )


def coverage(trace: Trace, window: Sequence[float] | None) -> float | None:
    """Samples taken in the measured window over the samples due at the sampler's interval (capped at 1).

    Well below 1 means the sampler thread itself did not get the CPU: its figures for the window are thin.
    """
    if not window or window[1] <= window[0] or trace.interval_s <= 0:
        return None
    due = (window[1] - window[0]) / trace.interval_s
    return round(min(1.0, len(trace.rows) / due), 3) if due >= 1 else None


def _median(values: list[float], scale: float) -> float | None:
    return statistics.median(values) / scale if values else None


@dataclass(frozen=True)
class VerdictRows:
    """The verdict rows and the figures they come with."""

    rows: list[Result]
    diagnosis: dict[str, Any]
    upgrade: dict[str, Any] | None = None
    mfu: Mfu | None = None


def diagnosis_rows(verdicts: list[Verdict], figs: StepFigures | None, r: ChildResult, s: Signals | None) -> VerdictRows:
    """The ``diagnosis``, ``upgrade-estimate`` and ``verify-mfu`` rows, with ``diagnosis``, ``upgrade``, ``mfu``."""
    if not verdicts:
        reason, fix = "the run ended before any measured step", "run verify for longer (--steps) and let it finish"
        if r.interrupted:
            reason = "interrupted before any measured step"
        elif r.error_kind == "crash":  # the crash is the next step, not the length of the run
            reason, fix = "the run crashed before any measured step", "fix the crash above, then run verify again"
        rows = [
            warn("diagnosis", f"cant-tell: {reason}", fix, value="cant-tell"),
            skip("upgrade-estimate", reason),
            skip("verify-mfu", reason),
        ]
        return VerdictRows(rows, {"verdict": "cant-tell", "verdicts": []})
    top = verdicts[0]
    diagnosis = {"verdict": top.id, "verdicts": [v.as_dict() for v in verdicts]}
    summary = f"{top.id} ({top.severity}, {top.confidence} confidence): {top.summary}"
    status = TIME_VERDICT_STATUS.get(top.id, "warn")
    first = (
        ok("diagnosis", summary, value=top.id, hint=top.fix)
        if status == "ok"
        else warn("diagnosis", summary, top.fix, value=top.id)
    )
    if figs is None or s is None:
        rows = [first, skip("upgrade-estimate", "no measured step"), skip("verify-mfu", "no measured step")]
        return VerdictRows(rows, diagnosis)
    up = upgrade_bound(s)
    m = mfu(r, figs.median_s)
    return VerdictRows([first, _upgrade(s, up), _mfu(m)], diagnosis, up, m)


def _upgrade(s: Signals, up: dict[str, Any]) -> Result:
    """Amdahl over the measured non-compute share: what a faster GPU can buy at most."""
    where = "a faster GPU" if s.device == "cuda" else "faster compute (a GPU)"
    cut, half = up["max_step_time_cut"], up["step_time_cut_at_2x"]
    rest = f"the other {percent(1 - cut)} (data wait, copies, launch gaps, checkpoints) does not scale with it"
    summary = f"{where} can cut step time by at most {percent(cut)}; {rest}; 2x faster math: -{percent(half)}"
    if percent(1 - cut) == "0%":  # nothing measured outside the math: no ceiling to name
        summary = f"the step is all math: {where} shortens it in proportion; 2x faster math: -{percent(half)}"
    return ok("upgrade-estimate", summary, value=up["max_step_time_cut"])


def _mfu(m: Mfu) -> Result:
    if m.value is None:
        return skip("verify-mfu", m.note)
    if m.value > 1.0:
        hint = "the FLOP count or the datasheet row is wrong"
        return warn("verify-mfu", f"MFU {100 * m.value:.0f}% is impossible: {m.note}", hint, value=m.value)
    return ok("verify-mfu", f"MFU {100 * m.value:.1f}% ({m.note})", value=round(m.value, 4))


def sampler_block(p: Setting, o: Outcome) -> tuple[Result, dict[str, Any]]:
    """The ``verify-sampler`` row and ``measurements.sampler`` (the measured window's summary)."""
    t: Trace = o.trace
    window = o.child.result.timeline.get("measure") if o.child.result else None
    summary = summarise(t.within(*window) if window else t, o.gpu_index, p.usable_cores)
    summary["overhead"] = summarise(t, None, p.usable_cores)["overhead"]  # the whole run's
    block = summary | {"csv": p.files.csv, "window": "measure" if window else "run", "rows": len(t.rows)}
    over = summary["overhead"]
    gpu = (
        "no GPU columns: " + (o.gpu_error or "no GPU")
        if not t.gpus()
        else f"GPU {o.gpu_index if o.gpu_index is not None else 'all'}"
    )
    row = ok(
        "verify-sampler",
        f"{len(t.rows)} samples every {t.interval_s:g} s ({gpu}); sampler {over['cpu_ms_per_sample']:.2f} ms CPU per sample",
        value=len(t.rows),
    )
    return row, block


def cost_block(p: Setting, r: ChildResult, figs: StepFigures | None) -> tuple[Result, dict[str, Any] | None]:
    """The ``verify-cost`` row and ``measurements.cost`` (None without a price or a measured step)."""
    if not p.price_per_hour:
        return skip("verify-cost", "no price: pass --price-per-hour (or set preflight.verify.price_per_hour)"), None
    if figs is None:
        return skip("verify-cost", "no measured step to price"), None
    user = r.data.samples if r.data is not None and r.data.kind == "user" else None
    epoch = p.epoch_samples or user
    c = cost(p.price_per_hour, figs.step_s, r.samples_per_step, figs.shares, epoch, r.tokens_per_sample)
    return ok("verify-cost", describe(c), value=c.get("per_epoch", c["per_million_samples"])), c
