"""Judge a verify run: the child's measurements and the sampler's trace become results, verdicts and figures.

Result ids (after bootstrap's own): ``verify-data``, ``verify-loop``, ``verify-throughput``, ``verify-loss``,
``verify-checkpoint``, ``verify-data-resume``, ``verify-mfu``, ``verify-sampler``, ``diagnosis`` (value: the verdict
id, see ``checks/verify/diagnosis.py``), ``upgrade-estimate``, ``verify-cost``, ``verify-compile-ab``, ``verify-sweep``.
The gate fails (exit 1) on a failed check, a run that did not complete, NaN/inf or a loss that does not go down,
a checkpoint that does not reproduce, or throughput under the floor.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from checks.config import VerifyConfig
from checks.machine import datasheet
from checks.result import Result, fail, ok, skip, warn
from checks.verify import distributed
from checks.verify.advice import loader_advice
from checks.verify.cost import cost, describe
from checks.verify.diagnosis import Signals, Verdict, diagnose, upgrade_bound
from checks.verify.plan import Outcome, Plan
from checks.verify.results import checkpoint_result, compile_result, data_resume_result, loop_results, sweep_result
from checks.verify.sampler import Trace, gpu_summary, overlap_mean, summarise
from checks.verify.smoke.figures import breakdown, enqueue_ratio, fetch_windows, loss_trend, step_figures

# cant-tell is a warn: a run that could not be judged has not cleared the box, so the call to action is its fix.
TIME_VERDICT_STATUS = {"compute-bound": "ok"}


def samples_per_step(r: dict[str, Any]) -> int:
    """Samples one optimizer step trains on, over every rank (each rank trains ``batch_size`` x ``accum``)."""
    ranks = int((r.get("ddp") or {}).get("world_size") or 1)
    return int(r.get("batch_size") or 0) * int(r.get("accum") or 1) * ranks


def tokens_per_sample(r: dict[str, Any]) -> int:
    data = r.get("data") or {}
    return int(data.get("seq_len") or 0) if data.get("kind") in ("tokens", "user") else 0  # user: --model


def mfu(r: dict[str, Any], median_s: float) -> tuple[float | None, str, float | None]:
    """Model FLOPs utilisation against the dense datasheet peak of this exact card and dtype; never a fallback."""
    device = r.get("device") or {}
    if device.get("type") != "cuda":
        return None, "no GPU: MFU needs a GPU and its datasheet peak", None
    spec = datasheet.lookup(device.get("name") or "")
    if spec is None:
        return (
            None,
            f"MFU unknown: {device.get('name')} is not in templates/gpus.yaml (no other card's peak is used)",
            None,
        )
    # Dense fp16 with fp32 accumulate runs at the bf16 rate from sm_80 on (templates/gpus.yaml lists fp16 below).
    peak = {"bf16": spec.bf16_tflops, "fp16": spec.fp16_tflops or spec.bf16_tflops}.get(r.get("precision") or "")
    if peak is None:
        return None, f"MFU unknown: no {r.get('precision')} peak for {spec.model} in the table (bf16/fp16 only)", None
    if not r.get("flops_per_step"):
        return None, f"MFU unknown: {r.get('flops_note') or 'no FLOP count'}", peak
    return (
        r["flops_per_step"] / median_s / (peak * 1e12),
        f"{spec.model} dense {r['precision']} peak {peak:g} TFLOPS",
        peak,
    )


def signals(
    p: Plan, o: Outcome, cfg: VerifyConfig, figures: dict[str, Any], gate: Sequence[Result] | None = None
) -> Signals:
    """Assemble what the verdict rules read from the child's result, the trace of the measured window and the
    gate's rows (bootstrap's fast checks; None where they did not run)."""
    r = o.child.result or {}
    records = r.get("steps") or []
    window = (r.get("timeline") or {}).get("measure")
    trace = o.trace.within(*window) if window else o.trace
    waits = fetch_windows(records)
    tree = overlap_mean(trace, "tree_cpu_cores", waits) if waits else None
    machine = overlap_mean(trace, "cpu_pct", waits) if waits else None
    ab = r.get("ab") or {}
    ab_speedup = figures["median_s"] / ab["median_step_s"] if ab.get("median_step_s") else None  # error: no key
    ckpt = r.get("checkpoint") or {}
    return Signals(
        steps=len(records),
        device=(r.get("device") or {}).get("type", "cpu"),
        shares=figures["shares"],
        step_s=figures["step_s"],
        workers=int((r.get("loader") or p.loader).get("num_workers") or 0),
        usable_cores=p.usable_cores,
        cpu_during_wait=None if tree is None else tree / p.usable_cores,
        machine_cpu_during_wait=None if machine is None else machine / 100,
        iowait_during_wait=overlap_mean(trace, "iowait_pct", waits) if waits else None,
        kernels=None if "error" in (r.get("kernels") or {}) else r.get("kernels"),
        ab_speedup=ab_speedup,
        memory=r.get("memory"),
        gpu=gpu_summary(trace, o.gpu_index) if o.gpu_index is not None else None,
        checkpoint={"save_s": ckpt["save_s"], "bytes": ckpt["bytes"], "every_steps": p.ckpt_every}
        if "save_s" in ckpt
        else None,
        oom=r.get("oom"),
        precision=r.get("precision") or "fp32",
        machine_cpu=_median(trace.values("cpu_pct"), 100.0),
        tree_cpu=_median(trace.values("tree_cpu_cores"), p.usable_cores),
        sampler_coverage=coverage(trace, window),
        samples_s=figures.get("samples_per_s"),
        loader_alone=_probed(r, "loader_alone"),
        loader_advice=loader_advice(_probed(r, "loader_alone"), cfg.advice_min_gain),
        data_cost=_probed(r, "data_cost"),
        ddp=_ddp(r),
        gate=None if gate is None else tuple(gate),
    )


def _ddp(r: dict[str, Any]) -> dict[str, Any] | None:
    """``measurements.ddp`` (checks/verify/distributed.py), None for one process."""
    ddp = r.get("ddp")
    return distributed.figures(r, samples_per_step(r) // int(ddp["world_size"])) if ddp else None


def _probed(r: dict[str, Any], key: str) -> dict[str, Any] | None:
    """An optional phase's result; None when it did not run or failed (its error stays in the measurements)."""
    got = r.get(key)
    return None if not got or "error" in got else got


def coverage(trace: Trace, window: list[float] | None) -> float | None:
    """Samples taken in the measured window over the samples due at the sampler's interval (capped at 1).

    Well below 1 means the sampler thread itself did not get the CPU: its figures for the window are thin.
    """
    if not window or window[1] <= window[0] or trace.interval_s <= 0:
        return None
    due = (window[1] - window[0]) / trace.interval_s
    return round(min(1.0, len(trace.rows) / due), 3) if due >= 1 else None


def _median(values: list[float], scale: float) -> float | None:
    return statistics.median(values) / scale if values else None


def step_block(p: Plan, r: dict[str, Any]) -> dict[str, Any] | None:
    """Step figures with the checkpoint amortised in; None when no step was measured."""
    records = r.get("steps") or []
    if not records:
        return None
    figs = step_figures(records, samples_per_step(r), tokens_per_sample(r))
    save_s = (r.get("checkpoint") or {}).get("save_s") or 0.0
    per_step = save_s / p.ckpt_every
    figs["shares"] = breakdown(records, per_step)
    figs["step_s"] = figs["mean_s"] + per_step
    figs["checkpoint_s_per_step"] = per_step
    figs["checkpoint_every_steps"] = p.ckpt_every if save_s else None
    if figs["samples_per_s"]:  # the headline: what training with a save every ckpt_every steps sustains
        figs["samples_per_s_with_checkpoints"] = samples_per_step(r) / figs["step_s"]
        if figs.get("tokens_per_s"):
            figs["tokens_per_s_with_checkpoints"] = figs["samples_per_s_with_checkpoints"] * tokens_per_sample(r)
    return figs


def judge(
    p: Plan, o: Outcome, cfg: VerifyConfig, gate: Sequence[Result] | None = None
) -> tuple[list[Result], dict[str, Any], list[Verdict]]:
    """Results, measurements and verdicts of one run (complete, partial or failed); ``gate``: bootstrap's rows
    as verify ran them (the straggler verdict quotes its GPU's), None where they did not run."""
    r = o.child.result or {}
    figs = step_block(p, r)
    m: dict[str, Any] = {"run": _run_facts(p, o, r), "dataloader": r.get("loader") or p.loader}
    if figs is not None:
        m |= {
            "step_breakdown": figs["shares"],
            "step_time": {k: figs[k] for k in ("steps", "median_s", "p95_s", "mean_s")},
        }
        m |= {"samples_per_s": figs["samples_per_s"], "tokens_per_s": figs.get("tokens_per_s")}
        m |= {k: figs.get(k) for k in ("samples_per_s_with_checkpoints", "tokens_per_s_with_checkpoints")}
        m["enqueue_ratio"] = enqueue_ratio(r["steps"])
    results = [*loop_results(p, o, cfg, figs), _loss(r, cfg), checkpoint_result(p, r), data_resume_result(r)]
    s: Signals | None = None
    if figs is not None:
        s = signals(p, o, cfg, figs, gate)
    elif r.get("oom"):
        s = Signals(0, (r.get("device") or {}).get("type", "cpu"), {}, 0.0, oom=r["oom"])
    verdicts = diagnose(s, cfg) if s is not None else []
    results += _diagnosis(verdicts, figs, r, s, m)
    results += [_sampler(p, o, m), _cost(p, r, figs, m), compile_result(r, figs), sweep_result(r)]
    if r.get("ddp"):
        m["ddp"] = _ddp(r)
        results.append(distributed.ddp_result(m["ddp"]))
    keys = ("flops_per_step", "memory", "kernels", "checkpoint", "oom", "ab", "sweep", "loader_alone", "timeline")
    m |= {k: r[k] for k in keys if r.get(k)}
    m |= _advice(s, r)
    if (r.get("device") or {}).get("type") == "cpu":
        why = "no GPU: the run was on the CPU"
        m |= {
            "kernels": {"skipped": f"{why} (kernel statistics need CUDA)"},
            "memory": {"skipped": f"{why} (the CUDA allocator's figures)"},
        }
    m["files"] = {"json": p.json_path, "csv": str(p.csv_path), "png": str(p.png_path)}
    return results, m, verdicts


def _advice(s: Signals | None, r: dict[str, Any]) -> dict[str, Any]:
    """``loader_candidates``, ``advice`` and ``data_cost`` (contract: checks/verify/advice.py), when measured."""
    out: dict[str, Any] = {}
    if s is not None and s.loader_alone:
        out["loader_candidates"] = s.loader_alone.get("candidates") or []
        out["advice"] = s.loader_advice
    if r.get("data_cost"):
        out["data_cost"] = r["data_cost"]
    return out


def _run_facts(p: Plan, o: Outcome, r: dict[str, Any]) -> dict[str, Any]:
    keys = ("device", "precision", "batch_size", "accum", "model", "data", "torch", "threads")
    out = {k: r.get(k) for k in keys}
    out |= {"seconds": round(o.child.seconds, 2), "interrupted": o.child.interrupted or bool(r.get("interrupted"))}
    out |= {"failure": o.child.failure, "error": r.get("error")}
    return out


def _loss(r: dict[str, Any], cfg: VerifyConfig) -> Result:
    losses = [s["loss"] for s in (r.get("warmup") or []) + (r.get("steps") or [])]
    if not losses:
        return skip("verify-loss", "no step completed")
    t = loss_trend(losses)
    if not t["finite"]:
        bad = next(i for i, v in enumerate(losses) if v != v or v in (float("inf"), float("-inf")))
        return fail(
            "verify-loss",
            f"loss is NaN/inf from step {bad + 1}",
            "lower the learning rate; check the data and fp16 overflow",
            value=None,
        )
    summary = f"loss {t['first']:.4g} -> {t['last']:.4g} over {len(losses)} steps (first vs last quarter)"
    if t["decreasing"] or not cfg.loss_must_decrease:
        return ok("verify-loss", summary, value=t["last"])
    return fail(
        "verify-loss", summary + ": not going down", "check the learning rate, labels and data order", value=t["last"]
    )


def _diagnosis(
    verdicts: list[Verdict], figs: dict[str, Any] | None, r: dict[str, Any], s: Signals | None, m: dict[str, Any]
) -> list[Result]:
    if not verdicts:
        reason = (
            "the run ended before any measured step"
            if not r.get("interrupted")
            else "interrupted before any measured step"
        )
        m["diagnosis"] = {"verdict": "cant-tell", "verdicts": []}
        return [
            warn(
                "diagnosis",
                f"cant-tell: {reason}",
                "run verify for longer (--steps) and let it finish",
                value="cant-tell",
            ),
            skip("upgrade-estimate", reason),
            skip("verify-mfu", reason),
        ]
    top = verdicts[0]
    m["diagnosis"] = {"verdict": top.id, "verdicts": [v.as_dict() for v in verdicts]}
    summary = f"{top.id} ({top.severity}, {top.confidence} confidence): {top.summary}"
    status = TIME_VERDICT_STATUS.get(top.id, "warn")
    first = (
        ok("diagnosis", summary, value=top.id, hint=top.fix)
        if status == "ok"
        else warn("diagnosis", summary, top.fix, value=top.id)
    )
    out = [first]
    if figs is None or s is None:
        return [*out, skip("upgrade-estimate", "no measured step"), skip("verify-mfu", "no measured step")]
    return [*out, _upgrade(s, m), _mfu(r, figs, m)]


def _upgrade(s: Signals, m: dict[str, Any]) -> Result:
    """Amdahl over the measured non-compute share: what a faster GPU can buy at most."""
    up = m["upgrade"] = upgrade_bound(s)
    where = "a faster GPU" if s.device == "cuda" else "faster compute (a GPU)"
    cut, half = 100 * up["max_step_time_cut"], 100 * up["step_time_cut_at_2x"]
    rest = f"the other {100 - cut:.0f}% (data wait, copies, launch gaps, checkpoints) does not scale with it"
    summary = f"{where} can cut step time by at most {cut:.0f}%; {rest}; 2x faster math: -{half:.0f}%"
    return ok("upgrade-estimate", summary, value=up["max_step_time_cut"])


def _mfu(r: dict[str, Any], figs: dict[str, Any], m: dict[str, Any]) -> Result:
    value, note, peak = mfu(r, figs["median_s"])
    m["mfu"] = {"value": value, "note": note, "peak_tflops": peak}
    if value is None:
        return skip("verify-mfu", note)
    if value > 1.0:
        hint = "the FLOP count or the datasheet row is wrong"
        return warn("verify-mfu", f"MFU {100 * value:.0f}% is impossible: {note}", hint, value=value)
    return ok("verify-mfu", f"MFU {100 * value:.1f}% ({note})", value=round(value, 4))


def _sampler(p: Plan, o: Outcome, m: dict[str, Any]) -> Result:
    t: Trace = o.trace
    window = ((o.child.result or {}).get("timeline") or {}).get("measure")
    summary = summarise(t.within(*window) if window else t, o.gpu_index, p.usable_cores)
    summary["overhead"] = summarise(t, None, p.usable_cores)["overhead"]  # the whole run's
    m["sampler"] = summary | {"csv": str(p.csv_path), "window": "measure" if window else "run", "rows": len(t.rows)}
    over = summary["overhead"]
    gpu = (
        "no GPU columns: " + (o.gpu_error or "no GPU")
        if not t.gpus()
        else f"GPU {o.gpu_index if o.gpu_index is not None else 'all'}"
    )
    return ok(
        "verify-sampler",
        f"{len(t.rows)} samples every {t.interval_s:g} s ({gpu}); sampler {over['cpu_ms_per_sample']:.2f} ms CPU per sample",
        value=len(t.rows),
    )


def _cost(p: Plan, r: dict[str, Any], figs: dict[str, Any] | None, m: dict[str, Any]) -> Result:
    if not p.price_per_hour:
        return skip("verify-cost", "no price: pass --price-per-hour (or set preflight.verify.price_per_hour)")
    if figs is None:
        return skip("verify-cost", "no measured step to price")
    epoch = (p.data.samples if p.data and p.data.source == "staged" else None) or (
        (r.get("data") or {}).get("samples") if (r.get("data") or {}).get("kind") == "user" else None
    )
    c = cost(p.price_per_hour, figs["step_s"], samples_per_step(r), figs["shares"], epoch, tokens_per_sample(r))
    m["cost"] = c
    return ok("verify-cost", describe(c), value=c.get("per_epoch", c["per_million_samples"]))
