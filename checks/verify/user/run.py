"""``invoke verify [flags] -- COMMAND [ARGS...]``: run the user's own training command unchanged and judge it.

gather (the command under the agent and the sampler) -> evaluate (``judge``) -> render (the task layer). Nothing
here prints: the command's own output passes through the streams the caller gives, progress goes to ``say``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.facts import MachineFacts
from checks.probe.sample import GpuReader, HostReader
from checks.probe.torch import read_checkpoints
from checks.reports.verify import Checkpoint, CommFigures, DataInfo, Files, Measurements
from checks.result import Report, Result, Status, ok, skip
from checks.verify import distributed
from checks.verify import plan as v
from checks.verify import stop as stopper
from checks.verify.builtin import Builtin
from checks.verify.contract import Cut, StopFacts, StopSpec
from checks.verify.events import DdpLine, DeviceLine, Event, Moved, Saved, StepLine, Waiting
from checks.verify.report import Setting
from checks.verify.results import phase_spans
from checks.verify.resume import FirstSave, Replay, data_resume_result, replay, resume_result
from checks.verify.run import Judged, budget_s
from checks.verify.sampler import Sampler, Trace
from checks.verify.user import advice, exchange, itemcost, modelfix
from checks.verify.user import judge as j
from checks.verify.user import saved as saved_file
from checks.verify.user import solo as solo_leg
from checks.verify.user import sweep as sweeper
from checks.verify.user.launch import CommandRun, StopRule, own_stderr, run_command, step_counts
from checks.verify.watch import usable_here

Say = Callable[[str], None]


@dataclass(frozen=True)
class CommandRequest:
    """``invoke verify -- COMMAND``: the configuration, the command's argv and the flags that apply to it."""

    config: PreflightConfig
    command: tuple[str, ...]
    steps: int = 0  # 0: preflight.verify.steps
    warmup: int = -1  # -1: preflight.verify.warmup
    seconds: float = 0.0  # > 0: measure for this long instead of a number of steps
    json: str = ""
    plot: str = ""
    price_per_hour: float = 0.0
    quiet: bool = False  # hide the command's own output
    gate: bool = True  # re-run bootstrap's fast checks first, as verify does
    cwd: str = ""  # "": the current folder
    echo: IO[bytes] | None = None  # where the command's stderr goes as it comes (None: kept for the report only)
    budget: str = ""  # --budget as typed ("": preflight.verify.budget)
    sweep: bool = False  # --sweep: re-run the command at doubling batch sizes to the throughput knee
    ab: bool = False  # --ab: also time the model under torch.compile, when the run is compute-bound
    builtin: Builtin | None = None  # invoke verify without --: the command is the tool's own script
    facts: MachineFacts | None = None  # this machine, when the caller has read it already (the gate's input)


def rule(request: CommandRequest, deadline: float = 0.0) -> StopRule:
    """The stop rule from the flags and the configuration (exit 2 on a bad value); ``deadline`` (monotonic):
    the whole command's end, of which the measured run takes at most the half the loader re-runs do not need."""
    cfg = request.config.verify
    steps = request.steps or cfg.steps
    warmup = cfg.warmup if request.warmup < 0 else request.warmup
    if steps < 1 or warmup < 1 or request.seconds < 0:
        raise PreflightError(
            "verify: --steps and --warmup must be at least 1 with a command (its first step includes start-up)"
        )
    stop = None
    if not request.steps and not request.seconds:  # a count or a time the user typed is kept exactly
        budget = budget_s(request.budget, cfg)
        share = 0.5 if cfg.command_advice_s > 0 else 1.0
        end = deadline - budget * (1 - share) - stopper.TAIL_S if deadline else 0.0
        stop = StopSpec(cfg.critical_min_steps, cfg.stable_width, cfg.stable_batches, budget, end)
    return StopRule(warmup, steps, request.seconds, cfg.timeout_s, cfg.stall_timeout_s, stop=stop)


def executable(argv: Sequence[str], cwd: str) -> None:
    """Refuse an empty or unknown command before anything runs (exit 2)."""
    if not argv:
        raise PreflightError("verify: give the command after --", hint="invoke verify -- python train.py")
    first = argv[0]
    if os.sep in first:
        found = os.path.isfile(os.path.join(cwd, first)) and os.access(os.path.join(cwd, first), os.X_OK)
    else:
        found = shutil.which(first) is not None
    if not found:
        raise PreflightError(f"verify: command not found: {first}", hint="check the command after --")


def verify_builtin(
    request: CommandRequest, options: v.Options, say: Say, machine: Callable[[], MachineFacts] | None = None
) -> Judged:
    """``invoke verify`` without ``--``: the tool's own training script (``templates/train.py``, flags from
    ``options`` and ``preflight.verify``) run and judged as ``verify -- COMMAND`` runs any command; ``machine``
    reads this box (None: the local probe, torch's included)."""
    from checks.probe import LocalProbe
    from checks.verify.builtin import prepare

    cfg = request.config
    with ExitStack() as stack:  # a temporary checkpoint folder lives as long as the run and its re-runs
        warmup = cfg.verify.warmup if request.warmup < 0 else request.warmup
        read = machine or LocalProbe(cfg.probe.torch_timeout_s).machine
        b, facts = prepare(options, cfg, read, stack, warmup)
        if b.processes > 1:
            say(b.describe())
        steps = request.steps or options.steps
        built = dataclasses.replace(request, command=b.command, builtin=b, facts=facts, steps=steps)
        return verify_command(built, say)


def verify_command(request: CommandRequest, say: Say) -> Judged:
    """Run the command under the agent and the sampler, stop it by the rules, judge it, write the files."""
    started = time.monotonic()
    cfg, cwd = request.config, request.cwd or os.getcwd()
    budget = budget_s(request.budget, cfg.verify)
    executable(request.command, cwd)
    stop = rule(request, started + budget)
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify)
    gate_rows: list[Result] | None = None
    if request.gate:
        from checks.probe import LocalProbe

        facts = request.facts or LocalProbe(cfg.probe.torch_timeout_s).machine()
        gate_rows = v.gate(facts, cfg, request.builtin.device if request.builtin else "auto")
        cores, host = facts.host.usable_cores, facts.host.hostname
    else:
        cores, host = usable_here()
    price = request.price_per_hour or cfg.verify.price_per_hour
    setting = Setting(cores, Files(json_path, str(csv), str(png)), price, own_code=True)
    first = FirstSave(request.builtin.keep_dir) if request.builtin else None
    run, trace, gpu, gpu_error, order = _gather(request, stop, cwd, cores, say, first.seen if first else None)
    setting = dataclasses.replace(setting, nvml_uuids=order)
    gathered = Gathered(run, trace, gpu, gpu_error, stop, setting, gate_rows, host, started, budget, cwd, first)
    return evaluate(request, gathered, say)


@dataclass(frozen=True)
class Gathered:
    """The measured run and what ``verify_command`` set up around it: what ``evaluate`` judges."""

    run: CommandRun
    trace: Trace
    gpu: int | None
    gpu_error: str | None
    stop: StopRule
    setting: Setting  # the usable cores, the files, the price
    gate_rows: list[Result] | None
    host: str
    started: float  # monotonic: when verify began (verify-time)
    budget: float
    cwd: str
    first: FirstSave | None = None
    # False: the run spanned hosts (checks/verify/hosts.py): no re-run of the command (loader and model advice, the
    # exchange A/B, the resume replay, the batch searches), and no checkpoint file read here
    reruns: bool = True
    hosts: tuple[dict[str, Any], ...] = ()  # across nodes: which ranks ran where (``HostRanks``), for the DDP figures


def evaluate(request: CommandRequest, g: Gathered, say: Say) -> Judged:
    """Judge a measured run: the re-runs it calls for, the judge, the files, ``verify-time``."""
    run, trace, gpu, gpu_error, stop, setting = g.run, g.trace, g.gpu, g.gpu_error, g.stop, g.setting
    cfg, cwd, cores, host, first, gate_rows = request.config, g.cwd, setting.usable_cores, g.host, g.first, g.gate_rows
    started, budget = g.started, g.budget
    json_path, csv, png = setting.files.json, Path(setting.files.csv), Path(setting.files.png)
    stop, pressed = under_pressure(run, stop, budget)
    usage_error(request.command, run, builtin=request.builtin is not None)
    if run.ended == "no-torch":
        raise PreflightError(
            f"verify: {' '.join(request.command)} never imported torch ({j.describe_exit(run.returncode)})",
            hint="verify -- COMMAND times torch training scripts; check that the command is the training one",
        )
    cuts: list[Cut] = [pressed] if pressed is not None else []
    found = j.ranks(run.events, stop.warmup, stop.steps, stop.seconds)  # every process's steps, read once
    deadline = started + budget - stopper.TAIL_S
    advice = ab = model = saved = replayed = swept = oom = None
    one: solo_leg.Solo | None = None
    if g.reruns:
        measured = _measured(request, run, found)
        saved, kept = _saved(run, found, deadline, first)
        # the resume replay first: a checkpoint that does not resume outweighs any speed-up, and it is one short run
        replayed = _replay(request, run, found, kept, first.kept if first else "", cwd, say, deadline, cuts)
        one = _solo(request, run, found, stop, cwd, say, deadline, cuts)  # one short run, as the replay
        advice = _advice(request, measured, stop, cwd, cores, say, deadline, cuts, run.events)
        ab = _exchange(request, run, found, stop, cwd, say, deadline, cuts)
        waits = _comm_share(ab, run, found) >= cfg.verify.share_warn  # comm-bound: faster math would only wait longer
        model = None if advice or waits else _model_advice(request, run, measured, stop, cwd, say, deadline, cuts)
        swept = _sweep(request, run, found, cwd, say, deadline, cuts) if request.sweep else None
        oom = _largest(request, run, cwd, say, deadline) if sweeper.oom(run) else None
    setting = dataclasses.replace(
        setting,
        epoch_samples=epoch_samples(request.builtin, found),
        ckpt_every=request.builtin.ckpt_every if request.builtin else 0,
    )
    results, measurements, verdicts = j.judge(
        run, trace, setting, cfg.verify, stop.warmup, stop.steps, stop.seconds, gate_rows, gpu, gpu_error, advice,
        swept, oom, model, saved, ab, g.hosts,
    )  # fmt: skip
    results, measurements = _described(request, results, measurements, found, replayed)
    results, measurements = _scaling(results, measurements, one, g.reruns)
    steps = [j.step_record(s) for r in found[:1] for s in r.steps]
    warm = [j.step_record(s) for r in found[:1] for s in r.warmup]
    phases = phase_spans(run.events)
    if warm:
        phases = {"warmup": [(warm[0].host_start, warm[-1].host_end)], **phases}
    what = "invoke verify" if request.builtin else f"invoke verify -- {request.command[0]}"
    title = f"{what}: {verdicts[0].id if verdicts else 'cant-tell'}"
    block, ddp = measurements.steps, measurements.ddp
    problems = v.write_outputs(
        csv, png, trace, title, gpu, cores, steps=steps, warmup=warm, phases=phases,
        shares=block.step_breakdown if block else None,
        comm_share=ddp.comm_share if ddp else None, step_s=block.step_time.median_s if block else None,
        samples_per_s=block.samples_per_s if block else None,
    )  # fmt: skip
    ended = stop_facts(run, found, stop)
    cut = stopper.measure_cut(ended, budget) if ended is not None else None
    cuts = [cut, *cuts] if cut is not None else cuts
    seconds = time.monotonic() - started
    measurements = dataclasses.replace(
        measurements, time_to_verdict=stopper.time_to_verdict(budget, seconds, ended, cuts)
    )
    at = next((i + 1 for i, r in enumerate(results) if r.id == "verify-loop"), len(results))
    row = ok("verify-time", stopper.summary(budget, seconds, ended, cuts), value=round(seconds, 1))
    results = [*results[:at], row, *results[at:]]
    report = Report(host=host, machine="live", results=tuple(results), measurements=measurements.to_json())
    return Judged(
        report=report,
        verdicts=tuple(verdicts),
        json_path=json_path,
        notes=(*problems, f"wrote {json_path}, {csv}, {png}"),
        interrupted=run.interrupted or any(bool((x or {}).get("interrupted")) for x in (advice, swept, model)),
        background=frozenset(r.id for r in gate_rows or []),
        focus="diagnosis",
    )


def epoch_samples(builtin: Builtin | None, found: Sequence[j.Rank]) -> int | None:
    """Each process's share of an epoch, the samples ``verify-cost`` prices: the tool's staged data (synthetic data
    has no epoch), else the length of the dataset the command's DataLoader reads (a dataset without ``len``:
    None), split among the ranks as a ``DistributedSampler`` splits it."""
    if builtin is not None:
        samples = builtin.epoch_samples
    else:
        lead = found[0] if found else None
        got = lead.loader.samples if lead and lead.loader else None
        samples = got if got is not None and got > 0 else None
    return samples // max(1, len(found)) if samples else None


def _described(
    request: CommandRequest,
    results: list[Result],
    m: Measurements,
    found: Sequence[j.Rank],
    replayed: Replay | None,
) -> tuple[list[Result], Measurements]:
    """What the tool knows of its own script besides the agent's figures (``checks/verify/builtin.py``): the
    ``verify-data`` row before ``verify-loop``, the allocator setting it trained with, the data it read, and the
    out-of-memory fix as the flag that sets the batch; ``verify-data-resume`` after ``verify-checkpoint`` (a
    command's says it is checked only for the tool's script)."""
    b = request.builtin
    at = next((i + 1 for i, r in enumerate(results) if r.id == "verify-checkpoint"), len(results))
    results = [*results[:at], data_resume_result(b, replayed), *results[at:]]
    if b is None:
        return results, m
    lead = found[0] if found else None
    loader = lead.loader if lead else None
    dataset, samples = (loader.dataset, loader.samples) if loader else (None, None)
    data = b.data.to_json() if b.data is not None else {"kind": "user", "source": request.command[-1]}
    info = DataInfo.from_json({**data, "reader": dataset} if dataset else data)
    row = ok("verify-data", b.data_line(dataset or "", samples),
             value=info.to_json())  # fmt: skip
    out: list[Result] = []
    for r in results:
        if r.id == "verify-checkpoint" and replayed is not None:
            r = resume_result(b, replayed, m.checkpoint)
        elif r.id == "verify-checkpoint" and r.status is Status.OK:  # the file read back, no replay
            r = dataclasses.replace(r, summary=f"{r.summary}; no resume replayed: no step came after the first save "
                                    f"(step {b.first_save}) to compare, or no time was left (verify-time)")  # fmt: skip
        elif r.id == "verify-checkpoint" and r.status is Status.SKIP:
            r = skip("verify-checkpoint", f"the run ended before the script's first save (step {b.first_save}): "
                     "no save timed, no resume replayed")  # fmt: skip
        if r.id == "verify-command":
            r = dataclasses.replace(r, summary=r.summary.replace(shlex.join(request.command), b.shown(), 1))
        if r.id == "verify-loop":
            out.append(row)
            if r.status is Status.OK or r.status is Status.WARN:
                r = dataclasses.replace(r, summary=f"{r.summary}; allocator: {b.allocator()}")
            elif m.oom is not None and m.oom.largest_fit:
                r = dataclasses.replace(r, hint=f"the largest batch that fits is {m.oom.largest_fit}: "
                                        f"--batch-size {m.oom.largest_fit}")  # fmt: skip
        out.append(r)
    ckpt = m.checkpoint
    if replayed is not None:
        ckpt = dataclasses.replace(
            ckpt or Checkpoint(), dir=b.ckpt_dir, error=replayed.error or None, reproduced=replayed.reproduced,
            uninterrupted=replayed.uninterrupted, resumed=replayed.resumed,
            max_rel_diff=None if replayed.error else replayed.max_rel_diff, data=replayed.data,
        )  # fmt: skip
    return out, dataclasses.replace(m, run=dataclasses.replace(m.run, data=info), checkpoint=ckpt)


def _replay(
    request: CommandRequest,
    run: CommandRun,
    found: Sequence[j.Rank],
    saved: tuple[str, dict[str, Any]] | None,
    kept: str,
    cwd: str,
    say: Say,
    deadline: float,
    cuts: list[Cut],
) -> Replay | None:
    """The tool's own script: resume it from the checkpoint it saved and compare the losses (``resume.replay``)."""
    b, cfg = request.builtin, request.config.verify
    zero = j.rank_zero(found)
    if b is None or zero is None or saved is None or run.interrupted or run.ended not in ("stopped", "exited"):
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        cuts.append(
            Cut(
                "resume",
                "the resume replay was not run",
                f"--budget {stopper.more_budget(budget_s(request.budget, cfg), 30.0)}",
            )
        )
        return None
    say(f"verify: resuming the script from the checkpoint it saved ({saved[0]}) to compare the next steps' losses")
    return replay(b, saved, run.events, zero.pid, cwd, cfg.resume_steps, left, cfg.resume_rtol, kept)


def usage_error(argv: Sequence[str], run: CommandRun, builtin: bool = False) -> None:
    """A command that exits 2 before its first step refused its own flags or input (argparse, click and
    ``templates/train.py`` exit 2 on those): exit 2 too, with its own last line, rather than judging a crash."""
    stepped = any(isinstance(e, StepLine) for e in run.events)
    if run.returncode != 2 or stepped or run.ended not in ("crashed", "no-torch") or run.interrupted:
        return
    said = [line.strip() for line in own_stderr(run.stderr_tail) if line.strip()]
    if builtin:  # the tool's own script refused a verify flag it was given (it names the flag)
        line = said[-1].removeprefix("train.py: ") if said else "templates/train.py printed nothing"
        raise PreflightError(f"verify: {line}", hint="invoke verify passes its flags on to templates/train.py")
    raise PreflightError(
        f"verify: {shlex.join(argv)} exited 2 before its first step: {said[-1] if said else 'it printed nothing'}",
        hint="a command exits 2 on bad flags or input: run it alone to fix them; verify passes them on unchanged",
    )


def under_pressure(run: CommandRun, stop: StopRule, budget: float) -> tuple[StopRule, Cut | None]:
    """The rule the steps are judged by, and the cut said, when the budget ran out before
    ``MIN_UNDER_PRESSURE`` measured steps (a slow or crowded box): the warm-up's steps after the first (which
    holds the start-up) are judged too, rather than a late verdict or none."""
    if run.stop_reason != "budget":
        return stop, None
    counts, _ = step_counts(run.events)
    done = min(counts.values()) if counts else 0
    if done - stop.warmup >= stopper.MIN_UNDER_PRESSURE:
        return stop, None
    warmup = max(1, min(stop.warmup, done - stopper.MIN_UNDER_PRESSURE))
    lines = [e for e in run.events if isinstance(e, StepLine) and e.lead]
    paces = [e.seconds for e in lines[1:]]
    pace = statistics.median(paces) if paces else 0.0
    short = (stopper.MIN_MEASURED + stop.warmup - done) * pace
    when = (
        f"{done - stop.warmup} step(s) after the warm-up of {stop.warmup}"
        if done > stop.warmup
        else f"during the warm-up (step {done} of {stop.warmup})"
    )
    judged = f"step {done} is" if done == warmup + 1 else f"steps {warmup + 1}-{done} are"
    summary = f"the budget ran out {when} at {pace:.2f} s a step: {judged} judged, the warm-up's among them"
    return dataclasses.replace(stop, warmup=warmup), Cut(
        "warmup", summary, f"--budget {stopper.more_budget(budget, short)}"
    )


def stop_facts(run: CommandRun, found: Sequence[j.Rank], stop: StopRule) -> StopFacts | None:
    """How the measured steps of the command ended (the lead process's), for the report: the stop rule's reason
    when verify stopped it, else how it ended (exited, crashed, interrupted, stalled, limit)."""
    if not found:
        return None
    lead, spec = found[0], stop.stop
    if run.ended != "stopped":
        reason = run.ended
    else:
        reason = {"stable": "stable", "budget": "budget"}.get(run.stop_reason, "forced" if spec is None else "steps")
    # the pace the cut is told at: the measured steps', else the warm-up's after its first (which holds start-up)
    warm = [x.seconds for x in lead.steps or lead.warmup[1:] or lead.warmup]
    return StopFacts(
        reason,
        len(lead.steps),
        spec.min_steps if spec else len(lead.steps),
        stop.steps,
        stop.steps,
        spec.width if spec else 0.0,
        stopper.half_widths(stopper.rows_of(lead.steps), spec.batches if spec else 5),
        round(statistics.median(warm), 4) if warm else None,
    )


@dataclass(frozen=True)
class _Measured:
    """The run the re-runs start from: every process, the one whose breakdown explains the step, its figures, and
    rank 0's (the re-runs are timed on rank 0: DDP paces every rank to the slowest)."""

    found: list[j.Rank]
    lead: j.Rank
    figs: j.RankFigures
    base: j.RankFigures


def _measured(request: CommandRequest, run: CommandRun, found: list[j.Rank]) -> _Measured | None:
    """The measured run, where re-runs of the command can be compared with it (None: they cannot)."""
    cfg = request.config.verify
    if cfg.command_advice_s <= 0 or run.interrupted or run.ended not in ("stopped", "exited"):
        return None
    lead = j.pace_setter(found, cfg)
    if lead is None or not _whole_world(lead, len(found)):
        return None  # a rank on another node would wait for a rendezvous this re-run never joins: not measured
    # The tool's script saves far more often under verify than in the real run: its save is spread over the real
    # interval (as the report does), so that one timed save does not read as a checkpoint share that skips advice.
    every = request.builtin.ckpt_every if request.builtin else 0
    figs = j.rank_figures(lead, every)
    base = j.rank_figures(j.rank_zero(found) or lead, every)
    return None if figs is None or base is None else _Measured(found, lead, figs, base)


def _rerun_seconds(
    request: CommandRequest, stop: StopRule, deadline: float, cuts: list[Cut] | None, what: str
) -> float:
    """``verify.command_advice_s``, or what the budget leaves of it (less is a cut in ``cuts``)."""
    seconds = request.config.verify.command_advice_s
    if deadline and stop.stop is not None:
        left = deadline - time.monotonic()
        if left < seconds and cuts is not None:
            fix = f"--budget {stopper.more_budget(stop.stop.budget_s, seconds - left)}"
            done = f"{what} {'limited to ' + format(left, '.0f') + ' s' if left > 0 else 'not run'}"
            cuts.append(Cut("advice", f"{done} of verify.command_advice_s {seconds:g} s", fix))
        seconds = min(seconds, left)
    return seconds


def _advice(
    request: CommandRequest,
    m: _Measured | None,
    stop: StopRule,
    cwd: str,
    cores: float,
    say: Say,
    deadline: float = 0.0,
    cuts: list[Cut] | None = None,
    events: Sequence[Event] = (),
) -> dict[str, Any] | None:
    """For a run that waited for data: time candidate DataLoader settings on the command itself, within
    ``verify.command_advice_s`` and what the budget leaves (``deadline``; less is a cut in ``cuts``). Under
    torchrun on this box every rank's loaders get the candidate (the re-run starts them all), the usable cores are
    shared among the ranks, and the steps compared are rank 0's (DDP paces every rank to the slowest). ``events``:
    the measured run's, whose workers' batch times say whether fewer workers are worth timing; the tool's own
    script is advised by its ``--workers`` flag."""
    cfg = request.config.verify
    if m is None or m.lead.loader is None or m.figs.fig.shares["data_wait"] < cfg.share_warn:
        return None
    seconds = _rerun_seconds(request, stop, deadline, cuts, "the loader re-runs")
    if seconds <= 0:
        return None
    say(f"verify: the command waited for data: timing DataLoader settings on it (up to {seconds:.0f} s)")
    loader = m.lead.loader
    got = advice.measure(
        request.command, cwd, loader.asked, loader.site, m.base.fig.mean_s,
        cores / len(m.found), m.lead.device is not None and m.lead.device.type == "cuda", seconds, cfg.advice_min_gain,
        item=itemcost.item_cost(m.lead, events), wait_s=statistics.fmean(s.data_wait for s in m.lead.steps),
        flag="--workers" if request.builtin else "",
    )  # fmt: skip
    return _kept_cut(got, cuts)


def _exchange(
    request: CommandRequest,
    run: CommandRun,
    found: Sequence[j.Rank],
    stop: StopRule,
    cwd: str,
    say: Say,
    deadline: float,
    cuts: list[Cut],
) -> CommFigures | None:
    """Under torchrun with the agent's comm hook in place (not the script's own): the exposed exchange by A/B
    re-runs (``checks/verify/user/exchange.py``), within what the budget leaves of ``verify.command_advice_s``."""
    hooked = any(isinstance(e, DdpLine) and e.hooked for e in run.events)
    if len(found) < 2 or not hooked or run.interrupted or run.ended not in ("stopped", "exited"):
        return None
    seconds = _rerun_seconds(request, stop, deadline, cuts, "the exchange A/B")
    if seconds <= 0:
        return None
    say(f"verify: timing the gradient exchange by re-runs with and without it (up to {seconds:.0f} s)")
    ab = exchange.figures(exchange.measure(request.command, cwd, seconds), request.config.verify.exchange_ab_tolerance)
    if ab is not None and ab.noise:
        say(f"verify: the exchange A/B is {ab.noise}; the comm hook's figure stands")
    return ab


def _solo(
    request: CommandRequest,
    run: CommandRun,
    found: Sequence[j.Rank],
    stop: StopRule,
    cwd: str,
    say: Say,
    deadline: float,
    cuts: list[Cut],
) -> solo_leg.Solo | None:
    """Under torchrun: the command re-run as one process (``checks/verify/user/solo.py``), for DDP's scaling
    efficiency, within what the budget leaves of ``verify.command_advice_s``."""
    if len(found) < 2:
        return None
    if run.interrupted or run.ended not in ("stopped", "exited"):
        return solo_leg.Solo(None, f"no one-process run after a run that {run.ended}")
    seconds = _rerun_seconds(request, stop, deadline, cuts, "the one-process run")
    if seconds <= 1.0:
        return solo_leg.Solo(None, "no time for a one-process run (verify.command_advice_s, or the budget left)")
    say(f"verify: timing the command as one process for the scaling efficiency (up to {seconds:.0f} s)")
    return solo_leg.measure(request.command, cwd, seconds)


def _scaling(
    results: list[Result], m: Measurements, one: solo_leg.Solo | None, reruns: bool
) -> tuple[list[Result], Measurements]:
    """``measurements.ddp`` with the scaling efficiency (or why none), and its ``verify-ddp`` row after the loop's."""
    if m.ddp is None:
        return results, m
    why = "verify --hosts re-runs nothing on one box: no one-process run" if not reruns else "no one-process run"
    ddp = solo_leg.scaled(m.ddp, m.steps.samples_per_s if m.steps else None, one or solo_leg.Solo(None, why))
    at = next((i + 1 for i, r in enumerate(results) if r.id == "verify-loop"), len(results))
    return [*results[:at], distributed.ddp_result(ddp), *results[at:]], dataclasses.replace(m, ddp=ddp)


def _comm_share(ab: CommFigures | None, run: CommandRun, found: Sequence[j.Rank]) -> float:
    """The share of the step the ranks wait for the exchange: the A/B's where it ran, else the comm hook's; 0 for
    one process."""
    if len(found) < 2:
        return 0.0
    figures = j.rank_rows(found, j.rank_zero(found), run.events)
    if ab is not None:
        figures = j.with_exchange(figures, ab)
    return figures.comm_share or 0.0


def _model_advice(
    request: CommandRequest,
    run: CommandRun,
    m: _Measured | None,
    stop: StopRule,
    cwd: str,
    say: Say,
    deadline: float,
    cuts: list[Cut],
) -> dict[str, Any] | None:
    """For a compute-bound run (no data, copy or checkpoint share at its threshold): time model-side changes on
    the command itself (``checks/verify/user/modelfix.py``), within what the loader re-runs would have had."""
    cfg = request.config.verify
    if m is None:
        return None
    shares = m.figs.fig.shares
    if max(shares["data_wait"], shares["h2d"]) >= cfg.share_warn or shares["checkpoint"] >= cfg.checkpoint_share_warn:
        return None
    precisions = [s.precision for s in m.lead.steps if s.precision]
    changes = (["fp32"] if modelfix.emulated_bf16(run) else []) + modelfix.wanted(
        max(set(precisions), key=precisions.count) if precisions else None, request.ab
    )
    seconds = _rerun_seconds(request, stop, deadline, cuts, "the model-side re-runs")
    if seconds <= 0:
        return None
    say(f"verify: the command is compute-bound: timing {', '.join(changes)} on it (up to {seconds:.0f} s)")
    got = modelfix.measure(request.command, cwd, changes, run, seconds, cfg.advice_min_gain, m.figs.fig.mean_s)
    return _kept_cut(got, cuts)


def _kept_cut(got: dict[str, Any], cuts: list[Cut] | None) -> dict[str, Any]:
    """Keep the ``advice`` cut ``_rerun_seconds`` noted only when the re-runs were limited by it: a candidate
    skipped for the seconds left, or a re-run stopped at the limit (a run whose re-runs all fit cut nothing)."""
    rows = got.get("candidates") or []
    limited = any(str(r.get("skipped", "")).endswith(" left") or r.get("ended") == "limit" for r in rows)
    if cuts and cuts[-1].part == "advice" and not limited:
        cuts.pop()
    return got


def _saved(
    run: CommandRun, found: Sequence[j.Rank], deadline: float, first: FirstSave | None = None
) -> tuple[tuple[str, dict[str, Any]] | None, tuple[str, dict[str, Any]] | None]:
    """The last checkpoint rank 0 (or the only process) saved to a file, and the tool's script's first one kept
    aside for the resume replay (``FirstSave``: its original path), each with what it holds; both read in one
    child (one ``import torch``)."""
    zero = j.rank_zero(found)
    path = saved_file.last_saved(run.events, [zero.pid] if zero else sorted(run.pids))
    keep = first.kept if first is not None and first.kept else ""
    paths = [p for p in (path, keep) if p]
    if not paths:
        return None, None
    read = iter(read_checkpoints(paths, timeout=max(10.0, min(60.0, deadline - time.monotonic()))))
    last = (path, next(read)) if path else None
    return last, ((first.original, next(read)) if first is not None and keep else None)


def _whole_world(lead: j.Rank, seen: int) -> bool:
    """Every rank of the run is one this verify saw (one process, or torchrun on this box alone)."""
    world = next((s.world_size for s in lead.steps if s.world_size), None)
    return int(world or 1) == seen


def _sweep(
    request: CommandRequest,
    run: CommandRun,
    found: list[j.Rank],
    cwd: str,
    say: Say,
    deadline: float,
    cuts: list[Cut],
) -> dict[str, Any]:
    """--sweep: the command re-run at doubling batch sizes until the knee, within what the budget leaves."""
    if run.interrupted or run.ended not in ("stopped", "exited"):
        return {"skipped": f"the measured run {j.ENDED.get(run.ended, run.ended)}"}
    first = sweeper.start(j.pace_setter(found, request.config.verify))
    if isinstance(first, str):
        return {"skipped": first}
    say(f"verify: --sweep: re-running the command from batch {first.batch} (DataLoader at {first.site})")
    swept = sweeper.measure(request.command, cwd, first, request.config.verify, deadline)
    if "cut_at" in swept:
        fix = f"--budget {stopper.more_budget(budget_s(request.budget, request.config.verify), swept['cut_needs_s'])}"
        cuts.append(Cut("sweep", f"stopped before batch {swept['cut_at']} (about {swept['cut_needs_s']:g} s)", fix))
    return swept


def _largest(request: CommandRequest, run: CommandRun, cwd: str, say: Say, deadline: float) -> j.OomSearch:
    """Out of memory at the asked batch: the largest batch that fits, by re-runs within the budget."""
    say("verify: the command ran out of memory: re-running it at smaller batch sizes for the largest that fits")
    return sweeper.largest(request.command, cwd, run, deadline)


def estimate(stop: StopRule, step_s: float) -> str:
    """After the warm-up: how long the measured steps will take (the budget's deadline caps them)."""
    spec = stop.stop
    if stop.seconds:
        return f"verify: warm-up done, {step_s:.2f} s a step: measuring for {stop.seconds:g} s"
    if spec is None:
        return f"verify: warm-up done, {step_s:.2f} s a step: about {stop.steps * step_s:.0f} s for {stop.steps} steps"
    left = spec.deadline - time.monotonic()
    least, most = stopper.counts(stop.steps, spec.min_steps, step_s, left)
    if most * step_s > left:  # not even the fewest steps fit: say so, with what the budget still holds
        fit = max(int(max(left, 0.0) / step_s), 0)
        return (
            f"verify: warm-up done, {step_s:.2f} s a step: {max(left, 0.0):.0f} s of the {spec.budget_s:g} s budget "
            f"left for measured steps, {fit} at this pace; verify stops the command when the budget ends and "
            f"judges the steps it has (fewer than {stopper.MIN_MEASURED}: low confidence)"
        )
    span = f"{most * step_s:.0f}" if least == most else f"{least * step_s:.0f}-{most * step_s:.0f}"
    steps = (
        f"{most} measured steps" if least == most else f"{least} to {most} measured steps, until the shares are stable"
    )
    return f"verify: warm-up done, {step_s:.2f} s a step: about {span} s more ({steps}), within the {spec.budget_s:g} s budget"


def _gather(
    request: CommandRequest,
    stop: StopRule,
    cwd: str,
    cores: float,
    say: Say,
    saving: Callable[[Saved | Moved], None] | None = None,
) -> tuple[CommandRun, Trace, int | None, str | None, dict[int, str | None]]:
    """The command under the sampler (NVML and the command's process tree); ``saving`` hears each save as it
    lands. Also NVML's order of the GPUs (index -> UUID), which names each rank's GPU."""
    host = HostReader(usable=cores)
    gpu = GpuReader()
    found: dict[str, int | None] = {}
    shown: set[int] = set()

    warm: list[float] = []

    def event(e: Event | Waiting) -> None:
        if saving is not None and isinstance(e, (Saved, Moved)):
            saving(e)
        if isinstance(e, Waiting):  # the launcher's tick: no step for a while
            done = e.steps
            what = f"step {done + 1} running" if done else "waiting for the first optimizer step (start-up included)"
            say(f"verify: {what} for {e.seconds:.0f} s")
            return
        if isinstance(e, DeviceLine) and e.uuid and "index" not in found:
            sampler.focus(e.uuid)
            found["index"] = gpu.index_of(e.uuid)
        if isinstance(e, StepLine) and e.lead:
            i = e.i
            if i <= stop.warmup:
                warm.append(e.seconds)
            if i not in shown and (i == stop.warmup or i % 10 == 0):
                shown.add(i)
                say(f"verify: step {i} ({'warm-up' if i <= stop.warmup else 'measured'})")
            if i == stop.warmup:
                say(estimate(stop, statistics.median(warm[1:] or warm)))

    def started(pid: int) -> None:
        host.pid = pid
        shown = request.builtin.shown() if request.builtin else shlex.join(request.command)
        say(f"verify: started {shown} (pid {pid})")

    # --json -: stdout is the report alone, so the command's own output goes where its stderr goes
    stdout = subprocess.DEVNULL if request.quiet else (2 if request.json == "-" else None)
    echo = None if request.quiet else request.echo
    with ExitStack() as stack:
        sampler = stack.enter_context(Sampler(request.config.verify.sample_interval_s, gpu, host))
        profile = request.config.verify.profile_steps > 0  # 0: no kernel profile of a warm-up step on a GPU
        run = run_command(request.command, stop, cwd, echo, stdout, None, event, started, profile=profile, split=True)
    if run.ended == "stopped" and run.asked and not run.signals:
        say("verify: your command stopped itself after its measured steps (asked by should_stop(), no signal)")
    elif run.ended == "stopped":  # its own KeyboardInterrupt traceback, if it prints one, is this stop
        above = "" if request.quiet else ": a KeyboardInterrupt traceback above is this stop, not a failure"
        say(f"verify: stopped your command after its measured steps (SIGINT to its processes, as Ctrl-C does{above})")
    return run, sampler.trace, found.get("index"), gpu.error, dict(gpu.uuids)
