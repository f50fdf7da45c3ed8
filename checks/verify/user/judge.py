"""Judge the user's own command: the agent's step lines become verify's results, verdicts and measurements.

The step lines have the smoke loop's phase names (``data_wait``, ``h2d``, ``forward``, ``backward``,
``optimizer``, in seconds) plus ``checkpoint`` (time in ``torch.save`` and friends during that step), so the
breakdown, the verdict rules (``checks/verify/diagnosis.py``), the upgrade bound, the sampler summary and the
cost are verify's own code. What differs: ``forward`` is the step minus every hooked part (the forward pass and
the loop's own code: the loss, ``.to(device)``, logging), ``h2d`` is not hooked (0, inside ``forward``, unless the
script marks it with the agent's ``region("h2d")``), and checkpoint time is what the script itself saved,
amortised over the measured steps.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from checks.config import VerifyConfig
from checks.probe.nvml import uuid_key
from checks.reports.verify import (
    Checkpoint,
    CommandFacts,
    CommandStep,
    CommFigures,
    DataInfo,
    DdpFigures,
    Device,
    HostRanks,
    Measurements,
    Oom,
    ProcessFigures,
    RankRow,
    RunFacts,
    StepBlock,
    StepTime,
)
from checks.result import Result, fail, ok, skip, warn
from checks.verify import distributed
from checks.verify import report as verify_report
from checks.verify.contract import ChildResult, ChildRun, RankDevice, Step
from checks.verify.diagnosis import TIME_VERDICTS, Signals, Verdict, diagnose
from checks.verify.events import (
    DdpLine,
    DeviceLine,
    Event,
    FlopsLine,
    Hello,
    KernelsLine,
    LoaderLine,
    MemoryLine,
    StepLine,
    TorchVersion,
)
from checks.verify.figures import StepFigures, breakdown, enqueue_ratio, loss_trend, step_figures
from checks.verify.plan import Outcome
from checks.verify.report import Setting
from checks.verify.results import phases_result, sweep_result, throughput
from checks.verify.sampler import Trace
from checks.verify.user import cpuflags, itemcost
from checks.verify.user.launch import CommandRun
from checks.verify.user.saved import contents_result
from checks.verify.user.signals import extra as command_signals

ENDED = {
    "stopped": "stopped by verify",
    "exited": "ended by itself",
    "crashed": "crashed",
    "interrupted": "interrupted (Ctrl-C)",
    "no-step": "stopped by verify: no optimizer step",
    "stalled": "stopped by verify: steps stopped coming",
    "no-torch": "never imported torch",
}


@dataclasses.dataclass(frozen=True)
class OomSearch:
    """Out of memory at the asked batch: the largest that fits (None where the batch cannot be set: ``site`` then
    says why), the DataLoader's site, and the re-runs it took (``checks.verify.user.sweep.largest``)."""

    oom: Oom | None
    site: str
    runs: int


@dataclasses.dataclass(frozen=True)
class Rank:
    """One training process's steps: warm-up and measured, with the loader its steps consume from."""

    key: int | str  # the rank, or "pidN" for a process without one
    pid: int
    warmup: list[StepLine]
    steps: list[StepLine]
    loader: LoaderLine | None
    device: DeviceLine | None  # None: no device line (the CPU)
    flops: FlopsLine | None = None  # the agent's count of one warm-up step
    memory: MemoryLine | None = None  # its last ``memory`` line (CUDA only)
    kernels: KernelsLine | None = None  # its ``kernels`` line (one profiled warm-up step, CUDA only)


def device_json(d: DeviceLine | None) -> dict[str, Any]:
    """A process's device as ``measurements.per_rank`` writes it (``{"type": "cpu"}`` without a device line)."""
    return {"type": "cpu"} if d is None else {"type": d.type, "name": d.name, "uuid": d.uuid, "index": d.index}


def _last(events: Sequence[Event], kind: type[Event], pid: int) -> Any:
    """Process ``pid``'s last line of ``kind``; None without one."""
    return next((e for e in reversed(events) if isinstance(e, kind) and e.pid == pid), None)


def oom_memory(events: Sequence[Event]) -> dict[str, Any] | None:
    """The allocator's figures of a run that ran out of memory (the ``Oom`` record's ``memory``): each process's
    last ``memory`` line (the agent writes one at exit), of a process that counted an out-of-memory error if one
    did, the fullest card of those; None where no process wrote one (a CPU run, or CUDA never initialised)."""
    last: dict[int, MemoryLine] = {}
    for e in events:
        if isinstance(e, MemoryLine):
            last[e.pid] = e
    found = [e for e in last.values() if e.num_ooms] or list(last.values())
    if not found:
        return None
    full = max(found, key=lambda e: e.peak_reserved_bytes / (e.total_bytes or 1))
    return full.figures()


def ranks(events: Sequence[Event], warmup: int, steps: int, seconds: float) -> list[Rank]:
    """Every process that stepped, rank order; its first ``warmup`` steps apart, then ``steps`` (all with
    ``seconds``)."""
    by: dict[int | str, list[StepLine]] = {}
    for e in events:
        if isinstance(e, StepLine):
            by.setdefault(e.key, []).append(e)
    out = []
    for key, records in sorted(by.items(), key=lambda kv: (isinstance(kv[0], str), str(kv[0]).zfill(6))):
        pid = records[-1].pid
        measured = records[warmup:] if seconds else records[warmup : warmup + steps]
        feed = measured[-1].feed if measured else records[-1].feed
        loaders = [e for e in events if isinstance(e, LoaderLine) and e.pid == pid and e.feed == feed]
        loader = loaders[-1] if loaders else None
        device, flops = _last(events, DeviceLine, pid), _last(events, FlopsLine, pid)
        memory, kernels = _last(events, MemoryLine, pid), _last(events, KernelsLine, pid)
        out.append(Rank(key, pid, records[:warmup], measured, loader, device, flops, memory, kernels))
    return out


def step_record(line: StepLine) -> Step:
    """The contract's ``Step`` of one agent step line."""
    return Step(
        data_wait=line.data_wait,
        h2d=line.h2d,
        forward=line.forward,
        backward=line.backward,
        optimizer=line.optimizer,
        host_start=line.host_start,
        host_end=line.host_end,
        enqueue_s=line.enqueue_s,
        fetch=line.fetch,
        loss=float("nan") if line.loss is None else line.loss,
    )


def _median_int(values: Sequence[int]) -> int:
    return int(statistics.median(values)) if values else 0


@dataclasses.dataclass(frozen=True)
class RankFigures:
    """One process's figures: verify's ``StepFigures`` (checkpoints amortised over the measured steps) and what
    only a command run has (micro-batches and samples per optimizer step, the script's own saves)."""

    fig: StepFigures
    micro_batches: int
    samples_per_step: int | None
    checkpoint: Checkpoint | None
    tokens_per_step: int | None = None  # batches of token ids: input_ids [B, T] (B x T), a [B, T] integer tensor


def rank_figures(r: Rank, every: int = 0, saver: Rank | None = None) -> RankFigures | None:
    """Step time, shares (checkpoints amortised over the measured steps) and samples/s of one process; ``every``
    > 0: a save is made every that many steps in the real run (the tool's own script saves more often under
    verify, so that one lands among the measured steps), and its time is amortised over them. ``saver``: the
    process whose saves count when ``r`` saved nothing (under DDP rank 0 saves for all, and every rank waits for
    it at the next exchange)."""
    if not r.steps:
        return None
    samples = _median_int([s.samples for s in r.steps])
    records = [step_record(s) for s in r.steps]
    figs = step_figures(records, samples)
    saving = r if saver is None or any(s.saves for s in r.steps) else saver
    ckpt = sum(s.checkpoint for s in saving.steps)
    saves = sum(s.saves for s in saving.steps)
    per_step = ckpt / saves / every if every and saves else ckpt / len(saving.steps)
    step_s = figs.mean_s + per_step
    rate = figs.samples_per_s or None
    tokens = _median_int([s.tokens for s in r.steps])
    figs = dataclasses.replace(
        figs,
        shares=breakdown(records, per_step),
        step_s=step_s,
        samples_per_s=rate,
        tokens_per_s=tokens / figs.mean_s if tokens and figs.mean_s > 0 else None,
        checkpoint_s_per_step=per_step,
        checkpoint_every_steps=every if every and saves else None,  # a save timed, then amortised over ``every``
        samples_per_s_with_checkpoints=samples / step_s if rate else None,
        tokens_per_s_with_checkpoints=tokens / step_s if tokens and step_s > 0 else None,
    )
    checkpoint = (
        Checkpoint(
            save_s=ckpt / saves,
            bytes=round(sum(s.ckpt_bytes for s in saving.steps) / saves),
            every_steps=every or _every(len(saving.steps), saves),
            saves=saves,
        )
        if saves
        else None
    )
    micro = _median_int([s.micro for s in r.steps]) or 1
    return RankFigures(figs, micro, samples or None, checkpoint, tokens or None)


def _times(rate: float | None, world: int) -> float | None:
    """A rank's rate for every rank (each trains its own batches)."""
    return rate * world if rate else None


def _every(steps: int, saves: int) -> float:
    return round(steps / saves, 1)


def _child_result(lead: Rank, figs: RankFigures | None) -> ChildResult:
    """The contract's ``ChildResult`` of the lead process, which verify's own judging code reads."""
    micro = figs.micro_batches if figs else 1
    per_micro = ((figs.samples_per_step if figs else None) or 0) // micro
    window = (lead.steps[0].host_start, lead.steps[-1].host_end) if lead.steps else None
    loader = lead.loader.settings if lead.loader else {}
    d = lead.device
    precisions = [s.precision for s in lead.steps if s.precision]
    precision = max(set(precisions), key=precisions.count) if precisions else None
    flops = lead.flops.flops if lead.flops else None
    if lead.flops is None:
        note = "the agent counted no step (it counts the last warm-up step: --warmup 2 or more)"
    else:
        note = lead.flops.note or ""
    return ChildResult(
        precision=precision,
        flops_per_step=int(flops) if flops else None,
        flops_note=note or None,
        memory=lead.memory.figures() if lead.memory else None,
        kernels=lead.kernels.figures() if lead.kernels else None,
        steps=tuple(step_record(s) for s in lead.steps),
        warmup=tuple(step_record(s) for s in lead.warmup),
        device=Device(type=d.type or "cpu", name=d.name or "CPU", uuid=d.uuid) if d else Device(type="cpu", name="CPU"),
        batch_size=per_micro or None,
        accum=micro,
        loader=dict(loader),
        timeline={"measure": window} if window else {},
        data=DataInfo(kind="command", seq_len=_tokens_per_sample(figs)),
    )


def _tokens_per_sample(figs: RankFigures | None) -> int | None:
    """Batches of token ids: the tokens per sample (the sequence length; its mean where batches vary), which prices
    a million tokens (``ChildResult.tokens_per_sample``); None for other batches."""
    if figs is None or not figs.tokens_per_step or not figs.samples_per_step:
        return None
    return round(figs.tokens_per_step / figs.samples_per_step) or None


def judge(
    run: CommandRun,
    trace: Trace,
    setting: Setting,
    cfg: VerifyConfig,
    rule_warmup: int,
    rule_steps: int,
    rule_seconds: float,
    gate: Sequence[Result] | None,
    gpu_index: int | None = None,
    gpu_error: str | None = None,
    advice: dict[str, Any] | None = None,
    sweep: dict[str, Any] | None = None,
    oom: OomSearch | None = None,
    model: dict[str, Any] | None = None,
    saved: tuple[str, dict[str, Any]] | None = None,
    exchange: CommFigures | None = None,
    hosts: Sequence[dict[str, Any]] = (),
) -> tuple[list[Result], Measurements, list[Verdict]]:
    """Results, measurements (the report's JSON object) and verdicts of one run of the command; ``exchange``: the
    torchrun command's exchange A/B (``checks/verify/user/exchange.py``), whose figure replaces the hook's."""
    found = ranks(run.events, rule_warmup, rule_steps, rule_seconds)
    lead = pace_setter(found, cfg)
    ddp = rank_rows(found, lead, run.events, setting.nvml_uuids) if len(found) > 1 else None  # the ranks, read once
    if ddp is not None and exchange is not None:
        ddp = with_exchange(ddp, exchange)
    if ddp is not None and hosts:  # across nodes: where the ranks ran, and what the link carried while they waited
        ddp = dataclasses.replace(ddp, hosts=tuple(HostRanks.from_json(dict(h)) for h in hosts))
        ddp = dataclasses.replace(ddp, link_mbit_s=distributed.link_mbit_s(ddp))
    saver = next((r for r in found if any(x.saves for x in r.steps)), None)  # rank 0 first
    figs = rank_figures(lead, setting.ckpt_every, saver) if lead else None
    child = _child_result(lead, figs) if lead else ChildResult()
    child = dataclasses.replace(child, sweep=sweep, oom=oom.oom if oom else None)
    if run.ended == "crashed":
        last = run.traceback()
        child = dataclasses.replace(
            child, error=last[-1] if last else describe_exit(run.returncode), error_kind="crash"
        )
    outcome = Outcome(
        ChildRun(result=child, interrupted=run.interrupted, seconds=run.seconds), trace, gpu_index, gpu_error
    )
    results = [command_result(run, found, rule_warmup)]
    s = None
    if figs is not None and lead is not None:
        world = max(1, len(found))
        f = figs.fig
        whole = dataclasses.replace(
            f,
            samples_per_s=_times(f.samples_per_s, world),
            samples_per_s_with_checkpoints=_times(f.samples_per_s_with_checkpoints, world),
            tokens_per_s=_times(f.tokens_per_s, world),
            tokens_per_s_with_checkpoints=_times(f.tokens_per_s_with_checkpoints, world),
        )
        figs = dataclasses.replace(figs, fig=whole)
        s = verify_report.signals(setting, outcome, figs.fig, gate)
        ckpt = figs.checkpoint.to_json() if figs.checkpoint else None
        s = dataclasses.replace(s, checkpoint=ckpt, ddp=ddp, own_code=True)
        s = dataclasses.replace(s, **command_signals(lead, run.events, s.device, s.precision))
        loop = _loop(lead, figs)
        if run.interrupted:
            loop = warn("verify-loop", f"interrupted: {loop.summary}", "the figures cover the steps before Ctrl-C",
                        value=loop.value)  # fmt: skip
        results.append(loop)
        if figs.fig.samples_per_s:  # the floor (verify.min_samples_per_s) gates a command as it gates the loop
            results.append(throughput(figs.fig, cfg, command=figs.fig.checkpoint_every_steps is None))
    else:
        results.append(_no_step(oom))
    results.append(_loss(lead, cfg))
    results += [r for r in [phases_result(run.events)] if r is not None]
    results.append(contents_result(*(saved or (None, None))))
    verdicts = diagnose(s, cfg) if s is not None else []
    if oom is not None:
        verdicts = _out_of_memory(child, oom, cfg)
    if len(found) > 1 and lead is not None:  # whose breakdown the verdicts read (the straggler names its own)
        verdicts = [v if v.id == "straggler" else dataclasses.replace(v, summary=f"rank {lead.key}: {v.summary}")
                    for v in verdicts]  # fmt: skip
    if advice is not None:
        verdicts = apply_advice(verdicts, advice)
    verdicts = itemcost.with_split(verdicts)  # where a sample's time goes, after whichever fix the loader got
    at = next((i for i, v in enumerate(verdicts) if v.id == "compute-bound"), None)  # after cpu-contended, if any
    if model is not None and at is not None and all(v.id == "cpu-contended" for v in verdicts[:at]):
        top = verdicts[at]
        fix = cpuflags.emulated_fix(model, model_fix(model, top.fix))  # what an fp32 re-run measured, if one ran
        top = dataclasses.replace(top, fix=fix, evidence={**top.evidence, "model_advice": model})
        verdicts = [*verdicts[:at], top, *verdicts[at + 1 :]]
    judged = verify_report.diagnosis_rows(verdicts, figs.fig if figs else None, child, s)
    sampler_row, sampler = verify_report.sampler_block(setting, outcome)
    cost_row, priced = verify_report.cost_block(setting, child, figs.fig if figs else None)
    results += [*judged.rows, sampler_row, cost_row, *([sweep_result(child)] if sweep is not None else [])]
    m = Measurements(
        run=RunFacts(
            device=child.device, precision=child.precision, batch_size=child.batch_size, accum=child.accum, model=None,
            data=child.data, torch=_torch_version(run, lead), threads=None, seconds=round(run.seconds, 2), interrupted=run.interrupted,
            failure=None if run.ended in ("stopped", "exited") else run.ended, error=None,
        ),
        dataloader=dict(lead.loader.settings if lead and lead.loader else {}),  # the keywords it used
        diagnosis=judged.diagnosis,
        sampler=sampler,
        files=setting.files,
        steps=None if figs is None or lead is None else _step_block(lead, figs),
        upgrade=judged.upgrade,
        mfu=judged.mfu,
        cost=priced,
        flops_per_step=child.flops_per_step,
        memory=child.memory,
        kernels=child.kernels,
        timeline=dict(child.timeline) or None,
        sweep=sweep,
        oom=child.oom,
        checkpoint=_checkpoint(figs.checkpoint if figs else None, saved),
        ddp=_judged_ddp(ddp, lead),
        command=command_facts(run, found),
        command_step=None if figs is None else CommandStep(
            figs.micro_batches, figs.samples_per_step, FORWARD, figs.tokens_per_step
        ),
        per_rank=tuple(per_rank(found)) if ddp is not None else None,
        command_advice=advice,
        model_advice=model,
        item_cost=s.item_cost if s is not None else None,
    )  # fmt: skip
    return [*(gate or []), *results], m, verdicts


def _torch_version(run: CommandRun, lead: Rank | None) -> str | None:
    """The torch the command imported (the agent's ``torch`` line; the lead process's where there are several)."""
    lines = [e for e in run.events if isinstance(e, TorchVersion) and e.version]
    mine = [e for e in lines if lead is not None and e.pid == lead.pid] or lines
    return mine[0].version if mine else None


def _no_step(search: OomSearch | None) -> Result:
    """``verify-loop`` of a run without a measured step: out of memory at the asked batch fails it."""
    if search is None:
        return skip("verify-loop", "no measured step")
    if search.oom is None:
        return fail("verify-loop", f"out of memory at the asked batch: {search.site}", "lower the batch size")
    fit = search.oom.largest_fit
    hint = f"the largest batch that fits is {fit}: batch_size={fit}" if fit else "no smaller batch fitted either"
    return fail("verify-loop", f"out of memory at batch {search.oom.batch}: {search.oom.message}", hint)


FORWARD = (
    "the forward pass and the loop's own code between the data and backward (loss, .to(device), logging): no hook "
    "separates them (a script's region('h2d') mark takes its copies out)"
)


def _out_of_memory(child: ChildResult, search: OomSearch, cfg: VerifyConfig) -> list[Verdict]:
    """The built-in loop's near-oom verdict, its fix in the command's terms (the DataLoader's ``batch_size``)."""
    if child.oom is None:  # the batch size could not be set: the reason is in ``site``
        fix = "lower the batch size your script asks for; bf16; activation checkpointing"
        return [Verdict("near-oom", "critical", "high", f"out of memory at the asked batch; {search.site}", fix, 1.0)]
    device = child.device.type if child.device else "cpu"
    (v,) = diagnose(Signals(0, device, {}, 0.0, oom=child.oom.to_json()), cfg)[:1]
    fit = child.oom.largest_fit
    runs = f"{search.runs} re-run(s) of your command"
    if not fit:
        fix = f"no smaller batch fitted in {runs} (or the budget ran out first): a smaller model, bf16, or more memory"
    else:
        fix = (
            f"batch_size={fit} where the DataLoader is built ({search.site}; measured to fit in {runs}), with "
            "gradient accumulation for the same global batch; bf16; activation checkpointing"
        )
    return [dataclasses.replace(v, fix=fix)]


def _checkpoint(timed: Checkpoint | None, saved: tuple[str, dict[str, Any]] | None) -> Checkpoint | None:
    """The script's saves during the measured steps, and what the last file it saved holds."""
    if saved is None:
        return timed
    return dataclasses.replace(timed or Checkpoint(), file=saved[0], contents=saved[1])


def with_exchange(d: DdpFigures, ab: CommFigures) -> DdpFigures:
    """The ranks' figures with the A/B's exposed exchange (the unchanged leg's mean step minus the skipped one's,
    never below zero) in place of the comm hook's, which misses buckets that block before the last one. An A/B too
    noisy to call (``ab.agreed`` False) is reported beside the hook's figure, which stands."""
    sync, skip = ab.sync_median_s or 0.0, ab.no_sync_median_s or 0.0
    if ab.agreed is False:
        return dataclasses.replace(d, ab=ab)
    if sync <= 0:
        return d
    wait = max(sync - skip, 0.0)
    return dataclasses.replace(d, ab=ab, comm_exposed_ms=round(1000 * wait, 3), comm_share=round(wait / sync, 4))


def _judged_ddp(d: DdpFigures | None, lead: Rank | None) -> DdpFigures | None:
    """``measurements.ddp`` of a command under torchrun: the ranks' rows, the judged rank's exposed exchange."""
    if d is None:
        return None
    return dataclasses.replace(d, judged_rank=lead.key if lead and isinstance(lead.key, int) else None)


def _step_block(lead: Rank, figs: RankFigures) -> StepBlock:
    f = figs.fig
    return StepBlock(
        step_breakdown=f.shares,
        step_time=StepTime(f.steps, f.median_s, f.p95_s, f.mean_s),
        samples_per_s=f.samples_per_s,
        tokens_per_s=f.tokens_per_s,
        samples_per_s_with_checkpoints=f.samples_per_s_with_checkpoints,
        tokens_per_s_with_checkpoints=f.tokens_per_s_with_checkpoints,
        enqueue_ratio=enqueue_ratio([step_record(s) for s in lead.steps]),
    )


def rank_zero(found: Sequence[Rank]) -> Rank | None:
    """Rank 0, else the first process (a command without ranks)."""
    return next((r for r in found if r.key == 0), found[0] if found else None)


def rerun_lead(run: CommandRun, warmup: int, steps: int) -> Rank | None:
    """A re-run's rank 0 (or only process), its first ``warmup`` steps apart: DDP paces every rank to the slowest,
    so its steps time the whole re-run."""
    return rank_zero(ranks(run.events, warmup, steps, 0))


def pace_setter(found: Sequence[Rank], cfg: VerifyConfig) -> Rank | None:
    """The rank whose breakdown explains the step: the straggler where one is found (the others spend the time it
    costs waiting inside backward, which would read as compute), else rank 0 (else the first process)."""
    first = rank_zero(found)
    slow = distributed.straggler(rank_rows(found).per_rank, cfg) if len(found) > 1 else None
    return next((r for r in found if slow and r.key == slow["rank"]), first)


def own_step_s(r: Rank) -> float | None:
    """A rank's own work per step (median): the step outside backward. DDP's all-reduce runs inside backward, and
    there every rank waits for the slowest one, so a rank whose data, forward or optimizer takes longer shows it
    here and makes the others' backward longer. (The smoke loop times ``no_sync`` steps for this instead; a
    user's command is not changed to run them.) Saves are left out: one rank (rank 0) saves for all, every
    ``ckpt_every`` steps, and a save among a few measured steps moved its median (a "straggler" that only saved);
    their cost is the checkpoint share's, judged by the checkpoint rule."""
    own = [s.data_wait + s.forward + s.optimizer for s in r.steps]
    return statistics.median(own) if own else None


def rank_rows(
    found: Sequence[Rank],
    lead: Rank | None = None,
    events: Sequence[Event] = (),
    nvml_uuids: Mapping[int, str | None] | None = None,
) -> DdpFigures:
    """The ranks as the straggler and comm-bound rules read them (``own_s``: ``own_step_s``; ``gpu``: ``gpu_of``
    the rank's device, the NVML index its UUID has in ``nvml_uuids``, bootstrap's ``gpuN``), and ``lead``'s exposed exchange where the agent's DDP comm hook timed it: from the last
    gradient bucket handed to the all-reduce to the end of backward, the part of the exchange no computation hid."""
    exposed = [s.comm_exposed for s in (lead.steps if lead else [])]
    sizes = [s.comm_bytes or 0 for s in (lead.steps if lead else [])]
    figs = rank_figures(lead) if lead else None
    timed = bool(exposed) and all(x is not None for x in exposed) and figs is not None and figs.fig.mean_s > 0
    mean = statistics.fmean(float(x or 0.0) for x in exposed) if timed else None
    backends = [e.backend for e in events if isinstance(e, DdpLine) and e.backend]
    exposed_ms = share = grad = None
    if timed and mean is not None and figs is not None:
        exposed_ms, share = round(1000 * mean, 3), round(mean / figs.fig.mean_s, 4)
        grad = int(statistics.median(sizes)) or None
    rows = []
    for r in found:
        if not isinstance(r.key, int):
            continue
        figs = rank_figures(r)
        gpu = distributed.gpu_of(rank_device(r.device, nvml_uuids or {}))
        wait = round(figs.fig.shares["data_wait"], 4) if figs else None
        median = figs.fig.median_s if figs else None
        rows.append(RankRow(r.key, median, own_step_s(r), None, wait, None, gpu))
    backend = backends[0] if backends else "the command's own"
    return DdpFigures(
        world_size=len(found), backend=backend, per_rank=tuple(rows), grad_bytes=grad, comm_exposed_ms=exposed_ms,
        comm_share=share,
    )  # fmt: skip


def rank_device(device: DeviceLine | None, nvml_uuids: Mapping[int, str | None]) -> RankDevice:
    """A rank's device (the agent's ``device`` line) with the NVML index of its UUID in the parent's NVML order
    (under CUDA_VISIBLE_DEVICES, or a PCI order unlike CUDA's, torch's index names another card)."""
    if device is None:
        return RankDevice("cpu")
    key = uuid_key(device.uuid) if device.uuid else None
    nvml = next((i for i, u in nvml_uuids.items() if key and u and uuid_key(u) == key), None)
    return RankDevice(device.type, device.index, device.uuid, nvml)


def per_rank(found: Sequence[Rank]) -> list[ProcessFigures]:
    """``measurements.per_rank``: every training process, with its figures where it measured a step."""
    out = []
    for r in found:
        figs = rank_figures(r)
        row = ProcessFigures(r.key, r.pid, len(r.steps), device_json(r.device))
        if figs:
            row = dataclasses.replace(
                row, median_s=figs.fig.median_s, own_s=own_step_s(r), step_breakdown=dict(figs.fig.shares),
                samples_per_s=figs.fig.samples_per_s, micro_batches_per_step=figs.micro_batches,
            )  # fmt: skip
        out.append(row)
    return out


def command_facts(run: CommandRun, found: Sequence[Rank]) -> CommandFacts:
    """``measurements.command``: what ran, how it ended, who ended it."""
    return CommandFacts(
        argv=tuple(run.argv),
        exit_status=run.returncode,
        ended=run.ended,
        stopped_by_verify=run.stopped_by_verify,
        ended_by_itself=run.ended in ("exited", "crashed", "no-torch"),
        signals=tuple(run.signals),
        seconds=round(run.seconds, 2),
        steps_seen={str(r.key): len(r.warmup) + len(r.steps) for r in found},
        processes_seen=len(run.pids),
        processes_left=tuple(run.left),
        traceback=tuple(run.traceback()) if run.ended == "crashed" else (),
    )


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def command_result(run: CommandRun, found: Sequence[Rank], warmup: int) -> Result:
    """``verify-command``: the command, how it ended, and (a crash) the last lines of its traceback."""
    cmd = shlex.join(run.argv)
    steps = max((len(r.warmup) + len(r.steps) for r in found), default=0)
    status = describe_exit(run.returncode)
    if run.left:
        hint = "kill them: " + " ".join(map(str, run.left))
        return fail("verify-command", f"{cmd}: processes left running: {run.left}", hint, value=run.ended)
    if run.ended == "crashed":
        last = run.traceback()
        rank = run.failed_rank()
        who = f"rank {rank}: " if rank is not None else ""  # under torchrun: the rank that failed first
        summary = f"{cmd} crashed ({status}) after {steps} optimizer step(s): {who}{last[-1] if last else ''}"
        return fail("verify-command", summary, "its traceback ends:\n" + "\n".join(last), value=run.ended)
    if run.ended == "no-step":
        imported = any(isinstance(e, Hello) for e in run.events)
        what = "no torch optimizer step" if imported else "no torch optimizer step (torch not even imported yet)"
        summary = f"{cmd}: {what} within {run.seconds:.0f} s (stopped by verify)"
        hint = (
            "verify counts torch.optim optimizer steps: a custom update rule or a framework without a torch "
            "optimizer is not seen (see docs/verify.md, where it cannot see); or the script needs longer "
            "(preflight.verify.timeout_s)"
        )
        return fail("verify-command", summary, hint, value=run.ended)
    if run.ended == "stalled":
        hint = "a hung collective or data read: run it alone and look where it waits (py-spy dump)"
        return fail("verify-command", f"{cmd}: steps stopped after {steps} (stopped by verify)", hint, value=run.ended)
    if run.ended == "interrupted":
        summary = f"{cmd}: interrupted after {steps} step(s); the figures cover the steps before Ctrl-C"
        return warn("verify-command", summary, "let it run to the end for a full report", value=run.ended)
    sent = "/".join(run.signals) or ("asked: should_stop()" if run.asked else "no signal")
    how = (
        f"stopped by verify after {steps} steps ({sent})"
        if run.ended == "stopped"
        else f"ended by itself after {steps} steps ({status})"
    )
    if run.ended == "exited" and steps <= warmup:
        summary = f"{cmd} ended by itself after {steps} step(s), all of them warm-up ({status})"
        return warn("verify-command", summary, "lower --warmup or let it train longer", value=run.ended)
    return ok("verify-command", f"{cmd}: {how}", value=run.ended)


def _loop(lead: Rank, figs: RankFigures) -> Result:
    micro = figs.micro_batches
    per = figs.samples_per_step
    batch = f", {per} samples per step" if per else ", batch size unreadable from the batches"
    accum = f" of {micro} micro-batches" if micro > 1 else ""
    rate = f", {figs.fig.samples_per_s:,.1f} samples/s" if figs.fig.samples_per_s else ""
    if figs.fig.tokens_per_s:
        rate += f", {figs.fig.tokens_per_s:,.0f} tokens/s ({figs.tokens_per_step:,} tokens per step)"
    summary = (
        f"{len(lead.steps)} optimizer steps{accum} measured ({len(lead.warmup)} warm-up excluded){batch}; "
        f"median {figs.fig.median_s * 1000:.1f} ms{rate} on {lead.device.name if lead.device else 'cpu'}"
    )
    precisions = {s.precision for s in lead.steps if s.precision}
    if precisions:  # the math as the agent saw it: autocast's dtype, else the weights' (tf32: fp32 matmul on TF32)
        summary += f", {'/'.join(sorted(precisions))}"
    count = lead.flops
    if count is not None and count.flops:
        n = float(count.flops)
        amount = f"{n / 1e12:,.3g} TFLOP" if n >= 1e12 else f"{n / 1e9:,.3g} GFLOP"
        summary += f"; {amount} per step (counted at warm-up step {count.step})"
    elif count is not None and count.note:
        summary += f"; FLOPs {count.note}"
    return ok("verify-loop", summary, value=len(lead.steps))


def _loss(lead: Rank | None, cfg: VerifyConfig) -> Result:
    """A NaN/inf loss fails; one that does not go down is a warning (a user's few dozen steps can be noisy)."""
    losses = [s.loss for s in ((lead.warmup + lead.steps) if lead else []) if s.loss is not None]
    if not losses:
        return skip("verify-loss", "no loss seen (backward on a one-element tensor)")
    t = loss_trend(losses)
    if not t["finite"]:
        return fail("verify-loss", "the loss is NaN/inf", "lower the learning rate; check the data and fp16 overflow")
    summary = f"loss {t['first']:.4g} -> {t['last']:.4g} over {len(losses)} steps (first vs last quarter)"
    if t["decreasing"] or not cfg.loss_must_decrease:
        return ok("verify-loss", summary, value=t["last"])
    return warn("verify-loss", summary + ": not going down yet", "check the learning rate and labels", value=t["last"])


@dataclasses.dataclass(frozen=True)
class Starved:
    """A cpu-starved verdict's CPU while the loop waited: the training tree's and the whole box's share of the
    usable cores, and how many those are."""

    mine: float
    machine: float | None
    cores: float


def measured_fix(advice: dict[str, Any], rule_fix: str, starved: Starved | None = None) -> str:
    """The verdict's fix: the measured change, or that none measured faster (then the rule's own fix).

    ``starved`` (a cpu-starved verdict's CPU during the waits) changes why every setting measured slower: the
    cores are already full, so more workers split them; the hand-off's cost is not what was shown.
    """
    faster = advice.get("faster")
    if faster:
        base, step = advice["baseline_mean_step_s"], faster["mean_step_s"]
        return (
            f"{advice['change']}: measured {faster['speedup']:.2f}x faster on your command "
            f"(mean step {base * 1000:.0f} -> {step * 1000:.0f} ms)"
        )
    tried = [r for r in advice.get("candidates", []) if r.get("speedup")]
    if not tried:
        return rule_fix
    shown = "; ".join(f"{_args(r['overrides'])}: {r['speedup']:.2f}x" for r in tried)
    if advice.get("not_measurable"):  # the box's own noise is larger than any gain: no guess dressed as a measure
        return (
            f"no DataLoader change is measurable on this box now: {advice['not_measurable']} ({shown}); run "
            "verify again when the box is quiet"
        )
    if all(r["speedup"] < 1 for r in tried):  # the rule's "more workers" is what was just measured slower
        if starved is not None:  # the cores are full: more workers split them
            busy = max(starved.machine if starved.machine is not None else 0.0, starved.mine)
            return (
                f"keep the DataLoader as it is: every setting tried measured slower on your command ({shown}); the "
                f"{starved.cores:g} usable cores are already {busy:.0%} busy while the loop waits "
                f"({starved.mine:.0%} your training processes), so more workers only split the same CPU: make each "
                "sample cheaper to produce (decode once ahead with invoke stage-data, smaller images, lighter "
                "augmentation), or rent more CPU cores per GPU"
            )
        base = advice["baseline_mean_step_s"] * 1000
        return (
            f"keep the DataLoader as it is: every setting tried measured slower on your command ({shown}), so "
            f"handing batches to workers costs more than it saves at {base:.1f} ms a step; the wait is the "
            "process building each batch itself: make that cheaper (one read per batch instead of one per sample "
            "and a collate), or train on larger batches"
        )
    # The rule's own fix names the settings just measured no faster: say what is left instead.
    rest = (
        "the loader's settings are not the limit: make each batch cheaper to produce (decode once ahead with invoke "
        "stage-data, lighter augmentation), or rent more CPU cores per GPU"
    )
    return _none_faster("DataLoader setting", advice, shown, rest)


def model_fix(advice: dict[str, Any], rule_fix: str) -> str:
    """A compute-bound verdict's fix: the measured change, or what was measured and the rule's own fix."""
    faster = advice.get("faster")
    if faster:
        return (
            f"{advice['change']}: {faster['change']} measured {faster['speedup']:.2f}x faster on your command, loss "
            f"agreeing (mean step {advice['baseline_mean_step_s'] * 1000:.0f} -> {faster['mean_step_s'] * 1000:.0f} ms)"
        )
    tried = [r for r in advice.get("candidates", []) if r.get("speedup")]
    if not tried:
        return rule_fix
    shown = "; ".join(
        f"{r['change']}: {r['speedup']:.2f}x" + ("" if r.get("loss_agrees") else " (loss moved)") for r in tried
    )
    # The rule's own list ("bf16 autocast, torch.compile") would advise again what was just measured: name only what
    # was not timed.
    untimed = [UNTIMED[c] for c in advice.get("not_timed", [])]
    rest = "the model's math is the limit here; " + "; ".join(
        [*(["not timed: " + ", ".join(untimed)] if untimed else []), "a faster GPU"]
    )
    if advice.get("not_measurable"):  # the box's own noise is larger than the gains seen: no guess dressed as one
        return f"no model-side change is measurable on this box now: {advice['not_measurable']} ({shown}); {rest}"
    return _none_faster("model-side change", advice, shown, rest)


UNTIMED = {"bf16": "bf16 autocast", "channels_last": "channels_last", "compile": "torch.compile (--ab times it)"}
UNTIMED["fp32"] = "fp32 (no bf16 autocast: this CPU emulates bf16)"


def _none_faster(what: str, advice: dict[str, Any], shown: str, rule_fix: str) -> str:
    """What was measured when nothing was ``min_gain`` faster, then the rule's own fix."""
    return f"no {what} measured {advice['min_gain']:.0%} faster on your command ({shown}); {rule_fix}"


def _args(setting: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in setting.items())


def apply_advice(verdicts: list[Verdict], advice: dict[str, Any]) -> list[Verdict]:
    """The primary data verdict with the measured fix and its evidence; the others as they were."""
    at = next((i for i, v in enumerate(verdicts) if v.id in ("data-bound", "cpu-starved")), None)
    if at is None or any(v.id in TIME_VERDICTS for v in verdicts[:at]):  # the primary time verdict is not data
        return verdicts
    top = verdicts[at]
    ev = top.evidence
    starved = None
    if top.id == "cpu-starved" and ev.get("cpu_during_wait") is not None and ev.get("usable_cores"):
        machine = ev.get("machine_cpu_during_wait")
        starved = Starved(
            float(ev["cpu_during_wait"]), None if machine is None else float(machine), float(ev["usable_cores"])
        )
    fix = measured_fix(advice, top.fix, starved)
    return [
        *verdicts[:at],
        dataclasses.replace(top, fix=fix, evidence={**ev, "command_advice": advice}),
        *verdicts[at + 1 :],
    ]
