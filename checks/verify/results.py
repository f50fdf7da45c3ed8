"""Results of a verify run that do not need the verdict rules: the loop, throughput, checkpoint, A/B, sweep;
and the text block that lists every verdict. Pure functions over the child's result (``contract.ChildResult``).
"""

from __future__ import annotations

from typing import Any

from checks.config import VerifyConfig
from checks.result import Result, fail, ok, skip, warn
from checks.units import count
from checks.verify.contract import ChildResult
from checks.verify.diagnosis import Verdict
from checks.verify.figures import StepFigures
from checks.verify.plan import Outcome, Plan


def _data_line(p: Plan, r: ChildResult) -> str:
    loader = r.loader or p.loader
    settings = ", ".join(f"{k}={v}" for k, v in loader.items())
    data = r.data
    if data is not None and (data.kind == "user" or p.data is None):
        what = f"your dataset {data.source} ({data.samples or 0:,} samples)"
    else:
        what = p.data.describe() if p.data else "data not built"
    return f"{what}; DataLoader({settings})" + (f" ({p.loader_note})" if p.loader_note else "")


def loop_results(p: Plan, o: Outcome, cfg: VerifyConfig, figs: StepFigures | None) -> list[Result]:
    """``verify-data``, ``verify-loop`` and ``verify-throughput``."""
    r = o.child.result or ChildResult()
    data = r.data.to_json() if r.data else (p.data.to_json() if p.data else None)
    out = [ok("verify-data", _data_line(p, r), value=data)]
    out.append(_loop(p, o, r, cfg, figs))
    if figs is None or not figs.samples_per_s:
        out.append(skip("verify-throughput", "no measured step"))
        return out
    out.append(throughput(figs, cfg))
    return out


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


def _allocator(p: Plan, o: Outcome) -> str:
    """The allocator setting the child trained with: bootstrap's (as new shells get it) or the user's own."""
    if not p.alloc.variables:
        return p.alloc.describe()
    kept = [f"{k} from your environment" for k in o.child.env_kept]
    given = [f"{k}={v}" for k, v in p.alloc.variables.items() if k not in o.child.env_kept]
    return ", ".join(given + kept) + (" (as bootstrap writes it for new shells)" if given else "")


def _loop(p: Plan, o: Outcome, r: ChildResult, cfg: VerifyConfig, figs: StepFigures | None) -> Result:
    log = (o.child.log_tail.strip().splitlines() or ["no output"])[-1][:300]
    if o.child.failure in ("timeout", "stalled"):
        limit = cfg.timeout_s if o.child.failure == "timeout" else cfg.stall_timeout_s
        what = "did not finish" if o.child.failure == "timeout" else "stopped reporting progress"
        who = "the training child" if o.child.rank is None else f"rank {o.child.rank} (every rank was stopped)"
        return fail(
            "verify-loop",
            f"{who} {what} within {limit:g} s and was killed",
            f"a hung CUDA call or a stuck DataLoader worker? last output: {log}",
        )
    if r.oom:
        oom = r.oom
        return fail(
            "verify-loop",
            f"out of memory at batch {oom.batch}: {oom.message}",
            f"the largest batch that fits is {oom.largest_fit}: --batch-size {oom.largest_fit}",
        )
    if r.error or o.child.failure:
        return fail("verify-loop", f"the training loop failed: {r.error or o.child.failure}", f"last output: {log}")
    if figs is None:
        return fail("verify-loop", "no step was measured", "run again; see the phases in the JSON report")
    model = f"{r.model.name} ({count(r.model.parameters)} parameters)" if r.model else "no model described"
    summary = (
        f"{figs.steps} steps ({len(r.warmup)} warm-up excluded) of {model}, batch {r.batch_size}"
        f"{' x ' + str(r.accum) if (r.accum or 1) > 1 else ''}, {r.precision} on {r.device.name if r.device else None}: "
        f"median {1000 * figs.median_s:.1f} ms, p95 {1000 * figs.p95_s:.1f} ms per step"
    )
    summary += f"; allocator: {_allocator(p, o)}"
    if o.child.interrupted or r.interrupted:
        return warn(
            "verify-loop", f"interrupted: {summary}", "the figures cover the steps before Ctrl-C", value=figs.steps
        )
    return ok("verify-loop", summary, value=figs.steps)


def checkpoint_result(p: Plan, r: ChildResult) -> Result:
    """``verify-checkpoint``: the round trip reproduces the losses; what a save costs."""
    c = r.checkpoint
    if c is None:
        return skip("verify-checkpoint", "the run ended before the checkpoint round trip")
    if c.error is not None or c.save_s is None:
        return fail(
            "verify-checkpoint",
            f"the checkpoint round trip failed: {c.error}",
            "is the checkpoint directory full or read-only?",
        )
    where = "a temporary directory (pass --ckpt-dir to time your real one)" if p.ckpt_temporary else c.dir
    mb = (c.bytes or 0) / 1e6
    cost = f"save {c.save_s:.2f} s ({mb:.0f} MB, {mb / c.save_s:.0f} MB/s) to {where}, load {c.load_s or 0:.2f} s"
    n = len(c.uninterrupted or ())
    if c.reproduced:
        exact = "exactly" if c.max_rel_diff == 0 else f"within {c.max_rel_diff or 0:.1e}"
        summary = f"resume reproduces the next {n} steps' loss {exact} (same batches replayed); {cost}"
        return ok("verify-checkpoint", summary, value=c.save_s)
    hint = (
        "the same batches were fed after the reload, so the state the checkpoint holds differs from the running "
        "one: randomness in the model outside the saved RNG states, a buffer missing from state_dict "
        "(persistent=False), optimizer or scheduler state not saved, or nondeterministic kernels"
    )
    losses = f"uninterrupted {list(c.uninterrupted or ())} vs resumed {list(c.resumed or ())}"
    summary = f"resume on the same {n} batches does not reproduce the loss: {losses}; {cost}"
    return fail("verify-checkpoint", summary, hint, value=c.save_s)


DATA_RESUME_FIX = (
    "seed each sample's random transforms from (epoch, index) (e.g. torch.Generator().manual_seed(seed * 1_000_003 "
    "+ epoch * len(dataset) + index) inside __getitem__), or store the loader's generator and sampler state in the "
    "checkpoint and re-create the iterator from it (torchdata's StatefulDataLoader)"
)


def data_resume_result(r: ChildResult) -> Result:
    """``verify-data-resume``: a loader rebuilt from the saved position yields the same batches (order and content).

    Judged apart from ``verify-checkpoint``: a pipeline whose augmentation cannot resume exactly still has a
    correct checkpoint; it warns, with the reason and the fix.
    """
    c = r.checkpoint
    d = c.data if c else None
    if d is None:
        why = "the checkpoint round trip failed" if c and c.error else "the run ended before the checkpoint round trip"
        return skip("verify-data-resume", why)
    n = d.batches
    if d.exact:
        summary = f"the loader rebuilt from the saved sampler position yields the next {n} batches bit for bit"
        return ok("verify-data-resume", summary, value=True)
    if not d.order_same:
        summary = (
            f"after a resume the next {n} batches hold other samples: the sample order does not resume "
            "(a sampler without a saved position or epoch)"
        )
        fix = "save the sampler's position and epoch (and call set_epoch) and rebuild the sampler from them"
        return warn("verify-data-resume", summary, fix, value=False)
    parts = " and ".join(d.differs) if d.differs else "inputs"
    same = f"the same samples in the same order (the sampler resumed), other {parts}"
    if "targets" in (d.differs or ()):
        same += " (random transforms that change the targets too, such as boxes flipped with the image)"
    if d.workers:
        why = (
            f"{same}: the random transforms run in {d.workers} DataLoader worker(s), which reseed from the "
            "loader's base seed + worker id when the iterator is re-created, so no checkpoint restores where "
            "their RNGs were"
        )
    else:
        why = f"{same}: the dataset draws randomness the checkpoint does not hold (its own generator or OS entropy)"
    return warn(
        "verify-data-resume",
        f"{why} (the checkpoint itself is judged by verify-checkpoint)",
        DATA_RESUME_FIX,
        value=False,
    )


def compile_result(r: ChildResult, figs: StepFigures | None) -> Result:
    """``verify-compile-ab``: the measured gain of torch.compile (--ab)."""
    ab = r.ab
    if not ab:
        return skip("verify-compile-ab", "not asked (--ab runs a quick torch.compile A/B)")
    if ab.get("error") or figs is None:
        reason = ab.get("error") or "no eager steps to compare with"
        return warn(
            "verify-compile-ab",
            f"torch.compile({ab.get('mode', '')}) failed: {reason}",
            "some models do not compile; the eager figures stand",
        )
    speedup = figs.median_s / ab["median_step_s"]
    summary = (
        f"torch.compile(mode='{ab['mode']}'): {speedup:.2f}x ({1000 * figs.median_s:.1f} -> "
        f"{1000 * ab['median_step_s']:.1f} ms per step; compiling took {ab['compile_s']:.0f} s)"
    )
    return ok("verify-compile-ab", summary, value=round(speedup, 3))


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
