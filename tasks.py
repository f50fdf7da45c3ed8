"""gpu-preflight tasks: ``invoke bootstrap``, ``snapshot``, ``alloc-conf``, ``stage-data``, ``verify``, ``watch``,
``diff``, ``lock``, ``plan``.

The CLI only. A task's flags are one frozen dataclass, a field per flag, in ``checks/cli/taskflags.py``. Each task
turns its flags into a package's request, calls one function of the package, prints what comes back and picks the
exit code. Run by ``invoke``, the last line hands the command line to the project's own Invoke program
(``checks/cli/program.py``: flag and configuration mistakes as one line, exit 2); imported, this file only defines
the tasks.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Collection, Context

from checks.cli import program
from checks.cli import taskflags as fl
from checks.cli.flags import fill, task
from checks.cli.terminal import LiveLine, check_output_path, emit, exit_with, interruptible, say, text_stream
from checks.config import PreflightConfig, load_defaults, make_config
from checks.errors import ExitStatus, PreflightError, terminate_as_interrupt
from checks.fleet import run as fleet_run
from checks.fleet.render import render_fleet
from checks.machine import bootstrap as bootstrap_run
from checks.machine.runner import SnapshotRequest, record_snapshot
from checks.render import render_text
from provision.alloc_env import diff
from provision.hosts import HostSpec, select_hosts

if TYPE_CHECKING:
    from checks.machine.runner import Check
    from checks.probe.launch import LaunchContext
    from checks.verify.plan import Options
    from checks.verify.run import Judged

CHECKOUT = Path(__file__).resolve().parent


def settings(c: Context) -> PreflightConfig:
    """Validate the merged ``preflight`` configuration (exit 2 on unknown keys or wrong types)."""
    return make_config(c.config.get("preflight", {}))


# --- bootstrap, snapshot, alloc-conf (checks/machine/, checks/fleet/, checks/env/) ----------------------------


@task()
def bootstrap(c: Context, f: fl.BootstrapFlags) -> None:
    """Check this machine right after renting it: driver, CUDA, torch, GPUs, CPU/RAM/shm, disks, benchmarks."""
    from checks.env.lock import lock_check, read_lock

    cfg = settings(c)
    if f.hook:
        return _hook(cfg, f)
    if f.expect_gpus >= 0:
        raise PreflightError("--expect-gpus is the hook's", hint="invoke bootstrap --hook --expect-gpus N")
    check_output_path(f.json)
    cfg = replace(cfg, bench=replace(cfg.bench, enabled=cfg.bench.enabled and f.bench))
    cfg = replace(cfg, hosts=replace(cfg.hosts, install=cfg.hosts.install or f.install))
    specs, source = select_hosts(f.hosts, f.hosts_file, os.environ, cfg.hosts.slurm and not f.machine)
    if specs and f.machine:
        raise PreflightError("--machine judges a snapshot; it cannot be combined with --hosts or --hosts-file")
    lock = read_lock(Path(f.lock or cfg.env.lock).expanduser()) if f.lock or cfg.env.lock else None  # before the run
    strict = f.strict or cfg.report.strict
    checks = (("env-lock", lock_check(lock)),) if lock else ()
    if not (f.machine or f.hosts or f.hosts_file):
        from checks.fleet import job
        from checks.probe.launch import launch_context

        ctx = launch_context()
        if job.in_a_job(ctx):  # srun / torchrun started this on every node: the job is the fleet, no SSH
            return _job(cfg, f, ctx, checks, strict)
    if f.drain:
        raise PreflightError(
            "--drain needs --hook (this node drains itself) or a Slurm job (srun: rank 0 drains the failing nodes)",
            hint="invoke bootstrap --hook --drain, or srun --ntasks-per-node=1 invoke bootstrap --drain",
        )
    if specs:
        text = lock.path.read_text(encoding="utf-8") if lock else ""
        request = fleet_run.FleetRequest(cfg, tuple(specs), source, CHECKOUT, dry_run=f.dry_run, lock=text)
        with interruptible(), terminate_as_interrupt():  # SIGTERM/SIGHUP also stop the remote processes
            report = fleet_run.fleet(request, notify=lambda line: say(f"gpu-preflight: {line}"))
        emit(lambda colour: render_fleet(report, colour), report.to_json(), f.json)
        return exit_with(report.exit_code(strict=strict))
    machine = Path(f.machine) if f.machine else None
    local = bootstrap_run.BootstrapRequest(cfg, machine=machine, dry_run=f.dry_run, extra_checks=checks)
    with interruptible(), terminate_as_interrupt():
        done = bootstrap_run.bootstrap(local)
    for note in done.notes:  # the diffs end in a newline already
        sys.stderr.write(note if note.endswith("\n") else note + "\n")
    env = done.measurements.environment
    summary = env.summary if env else None
    emit(
        lambda colour: render_text(done.report, colour, every_row=f.all, environment=summary),
        done.report.to_json(),
        f.json,
    )
    exit_with(done.report.exit_code(strict=strict))


def _job(
    cfg: PreflightConfig, f: fl.BootstrapFlags, ctx: LaunchContext, checks: tuple[tuple[str, Check], ...], strict: bool
) -> None:
    """bootstrap on every node of a job: rank 0 prints (and writes --json) the job's fleet report."""
    from checks.fleet import job

    if cfg.hosts.job_wait_s <= 0:
        raise PreflightError(
            f"preflight.hosts.job_wait_s is {cfg.hosts.job_wait_s:g}: rank 0 would not wait for any node",
            hint="set it above 0 (seconds; the default is 300)",
        )
    if f.drain and not job.slurm_named(ctx):
        raise PreflightError(f"--drain in a job drains Slurm nodes; this is a {ctx.engine} job outside Slurm")
    local = bootstrap_run.BootstrapRequest(cfg, dry_run=f.dry_run, extra_checks=checks)
    request = job.JobRequest(cfg, ctx, local, cfg.hosts.job_wait_s)
    with interruptible(), terminate_as_interrupt():
        report = job.job_bootstrap(request, notify=lambda line: say(f"gpu-preflight: {line}"))
    if report is None:  # not rank 0: its node's record went to rank 0, which reports the job
        return
    emit(lambda colour: render_fleet(report, colour), report.to_json(), f.json)
    for line in job.remediation(report, cfg, ctx) + (job.drain_failing(report, cfg, ctx) if f.drain else []):
        say(line)
    exit_with(report.exit_code(strict=strict))


def _hook(cfg: PreflightConfig, f: fl.BootstrapFlags) -> None:
    """bootstrap --hook: nothing on stdout; exit 0 healthy, 1 unhealthy with its one reason line on stderr."""
    from checks.machine import hook as hook_run
    from checks.probe.launch import this_node_name

    if f.hosts or f.hosts_file:
        raise PreflightError("--hook checks this node only (no --hosts or --hosts-file)")
    path = Path(f.machine) if f.machine else None
    request = hook_run.HookRequest(cfg, this_node_name(), path, f.drain, expect_gpus=f.expect_gpus)
    with interruptible(), terminate_as_interrupt():
        outcome = hook_run.run_hook(request)
    for line in filter(None, [outcome.note, outcome.reason]):
        say(line)
    exit_with(outcome.code)


@task()
def snapshot(c: Context, f: fl.SnapshotFlags) -> None:
    """Record this machine's facts to a snapshot file that `invoke bootstrap --machine FILE` replays."""
    if not f.out:
        raise PreflightError("snapshot needs --out FILE", hint="e.g. invoke snapshot --out box.json")
    with interruptible():
        facts = record_snapshot(fill(SnapshotRequest, f, config=settings(c), out=Path(f.out)))
    torch = facts.torch.version or "missing"
    print(f"wrote {f.out}: {len(facts.nvml.gpus)} GPU(s), torch {torch}, host {facts.host.hostname}")


@task(name="alloc-conf")
def alloc_conf(c: Context, f: fl.AllocConfFlags) -> None:
    """Write PYTORCH_CUDA_ALLOC_CONF into the shell start-up files and prove a fresh shell's torch reads it."""
    with interruptible():
        done = bootstrap_run.alloc_conf(fill(bootstrap_run.AllocConfRequest, f, config=settings(c)))
    paths = ", ".join(map(str, done.paths))
    for change in done.changes:
        print(diff(change) if f.dry_run else f"removed the allocator block from {change.path}")
    for note in done.notes:
        print(note, end="" if note.endswith("\n") else "\n")
    if done.report is None:
        if not done.changes:
            print("nothing to remove: no gpu-preflight block in " + paths)
        return
    if not done.notes:
        print("already in place: " + paths)
    report = done.report
    emit(lambda colour: render_text(report, colour), None, "")
    exit_with(ExitStatus.PROBLEMS if report.exit_code() else ExitStatus.OK)


# --- stage-data (datasets/) ---------------------------------------------------------------------------------


@task(name="stage-data")
def stage_data(c: Context, f: fl.StageFlags) -> None:
    """Copy a dataset to local disk and pre-decode it once into memory-mapped arrays (or .pt shards)."""
    from datasets import options, stage, words
    from datasets import progress as bars

    cfg = settings(c)
    # bars on a terminal (or asked for); elsewhere (a log, CI) a line every few seconds through say
    shown = bars.Bars(sys.stderr) if f.progress or sys.stderr.isatty() else bars.Lines(say)
    start = time.monotonic()
    if f.verify:
        with interruptible():
            problems = stage.verify(Path(f.verify), shown)
        for line in problems:
            print(f"{f.verify}: {line}")
        found = words.count(len(problems), "problem") if problems else "hashes and shapes match the manifest"
        print(f"verified {f.verify}: {found}")
        return exit_with(ExitStatus.PROBLEMS if problems else ExitStatus.OK)
    if not f.source:
        hint = "e.g. invoke stage-data --source ~/imagenet/train"
        raise PreflightError("stage-data needs --source (or --verify DIR)", hint=hint)
    request = options.build_request(cfg.stage, fill(options.Flags, f), cfg.disk)
    with interruptible():
        outcome = stage.stage(request, progress=shown, say=say)
    for note in outcome.notes:
        say(note)
    print(options.summary(outcome, time.monotonic() - start))


# --- verify and watch (checks/verify/) ----------------------------------------------------------------------


def _show_judged(judged: Judged, every_row: bool = False) -> None:
    """Print verify's or watch's report and verdicts and the files written; exit 130 when Ctrl-C cut it short.

    bootstrap's own rows (the gate) show only when they need a look, unless ``every_row``."""
    from checks.verify.results import render_verdicts

    def text(colour: bool) -> str:
        return render_text(judged.report, colour, every_row=every_row, background=judged.background, focus=judged.focus)

    emit(text, judged.report.to_json(), judged.json_path)
    text_stream(judged.json_path).write(render_verdicts(list(judged.verdicts)))
    for note in judged.notes:
        say(note)
    if judged.interrupted:
        raise PreflightError("interrupted (the partial report is written)", code=ExitStatus.INTERRUPTED)


@task()
def verify(c: Context, f: fl.VerifyFlags) -> None:
    """Train a few dozen steps as the real run will and say where step time goes: verdict, fix, cost."""
    from checks.verify.plan import Options

    cfg = settings(c)
    cfg = replace(cfg, report=replace(cfg.report, strict=cfg.report.strict or f.strict))  # --strict sets it
    if note := fl.timeout_note(f, cfg.verify):
        say(note)
    from checks.probe.launch import launch_context
    from checks.verify.job import in_job as across_job
    from checks.verify.job import torchrun_command

    if f.command and not (f.hosts or f.hosts_file):  # a command goes across hosts only with --hosts, or srun's nodes
        if torchrun_command(f.command) and across_job(ctx := launch_context()):
            return _verify_job(cfg, f, fill(Options, f), ctx)
        return _verify_command(cfg, f)  # any other command: judged where it runs (under srun: on each node)
    options = fill(Options, f)

    # A Slurm task (srun) or SkyPilot node runs its own part of the job's run (checks/verify/job.py), without SSH;
    # the allocation's node list is the host list only where nothing launched this process (salloc's shell).
    ctx = launch_context()
    in_job = ctx.engine in ("slurm", "skypilot")
    specs, source = select_hosts(f.hosts, f.hosts_file, os.environ, cfg.hosts.slurm and not in_job)
    if specs:
        return _verify_hosts(cfg, f, options, specs, source)
    if not across_job(ctx):  # one box, or a job of one node
        return _verify_builtin(cfg, f, options)
    return _verify_job(cfg, f, options, ctx)


def _verify_job(cfg: PreflightConfig, f: fl.VerifyFlags, options: Options, ctx: LaunchContext) -> None:
    """srun -N2 --ntasks-per-node=1 invoke verify [-- torchrun ...]: each task runs its node's part of one torchrun
    job across the job's nodes; node 0 gathers every node's run and judges it as a command (checks/verify/job.py),
    the others say where the report is and exit with their own ranks' status."""
    from checks.verify.job import Sent, verify_job
    from checks.verify.user.run import CommandRequest

    if not f.command and (only := fl.command_only_flags(f)):
        raise PreflightError(
            f"verify: {only[0]} applies to one box's run; across a job's nodes every node runs an exact step count",
            hint="leave it out under srun (--steps N sets the count)",
        )
    if own := fl.own_loop_flags(f) if f.command else []:
        raise PreflightError(
            f"verify: {own[0]} sets the tool's own script, not your command",
            hint="leave it out, or run verify under srun without -- COMMAND",
        )
    request = fill(CommandRequest, f, config=cfg, echo=None)
    with interruptible(), terminate_as_interrupt():
        done = verify_job(request, options, ctx, say)
    if isinstance(done, Sent):
        say(done.line)
        return exit_with(done.code)
    _show_judged(done, every_row=f.all)
    exit_with(done.report.exit_code(strict=cfg.report.strict))


def _verify_hosts(
    cfg: PreflightConfig, f: fl.VerifyFlags, options: Options, specs: list[HostSpec], source: str
) -> None:
    """verify --hosts h1,h2 [-- torchrun ...]: one torchrun job across the hosts, judged as a command is
    (checks/verify/hosts.py)."""
    from checks.verify.hosts import verify_hosts
    from checks.verify.user.run import CommandRequest

    if not f.command and (only := fl.command_only_flags(f)):
        raise PreflightError(
            f"verify: {only[0]} applies to one box's run; across hosts every node runs preflight.verify.steps",
            hint="leave it out with --hosts or under srun",
        )
    if f.nproc:
        raise PreflightError("--nproc is per box; with --hosts each host runs one rank per GPU (slots=N caps it)")
    own = [x for x in fl.own_loop_flags(f) if x not in ("--hosts", "--hosts-file")] if f.command else []
    if own:
        raise PreflightError(
            f"verify: {own[0]} sets the tool's own script, not your command",
            hint="leave it out, or run verify --hosts without -- COMMAND",
        )
    request = fill(CommandRequest, f, config=cfg, echo=None)
    with interruptible(), terminate_as_interrupt():
        judged = verify_hosts(request, options, specs, source, CHECKOUT, say)
    _show_judged(judged, every_row=f.all)
    exit_with(judged.report.exit_code(strict=cfg.report.strict))


def _verify_builtin(cfg: PreflightConfig, f: fl.VerifyFlags, options: Options) -> None:
    """invoke verify without --: the tool's own training script (templates/train.py) as the command."""
    from checks.verify.user.run import CommandRequest, verify_builtin

    request = fill(CommandRequest, f, config=cfg, echo=sys.stderr.buffer, command=())
    with interruptible(), terminate_as_interrupt():
        judged = verify_builtin(request, options, say=say)
    _show_judged(judged, every_row=f.all)
    exit_with(judged.report.exit_code(strict=cfg.report.strict))


def _verify_command(cfg: PreflightConfig, f: fl.VerifyFlags) -> None:
    """verify -- COMMAND: run the user's own command under the agent and judge it (checks/verify/user/)."""
    from checks.verify.user.run import CommandRequest, verify_command

    own = fl.own_loop_flags(f)
    if own:
        raise PreflightError(
            f"verify: {own[0]} sets verify's own loop, not your command's",
            hint="leave it out, or run verify without -- COMMAND",
        )
    request = fill(CommandRequest, f, config=cfg, echo=sys.stderr.buffer)
    with interruptible(), terminate_as_interrupt():
        judged = verify_command(request, say=say)
    _show_judged(judged, every_row=f.all)
    exit_with(judged.report.exit_code(strict=cfg.report.strict))


@task()
def watch(c: Context, f: fl.WatchFlags) -> None:
    """Sample GPU and CPU use while your own training runs and say which one holds it back."""
    from checks.verify import run as run_verify

    live = LiveLine(sys.stderr)  # what it has seen so far: in place on a terminal, a line every 10 s elsewhere
    try:
        judged = run_verify.watch(fill(run_verify.WatchRequest, f, config=settings(c)), say=say, progress=live)
    finally:
        live.close()
    _show_judged(judged)  # watch advises


# --- diff and lock (checks/env/) ----------------------------------------------------------------------------


@task(name="diff", positional=["a", "b"])
def env_diff(c: Context, f: fl.DiffFlags) -> None:
    """Say what differs between two boxes, ranked break / slow / info; exit 1 when something breaks training."""
    from checks.env.diff import diff as diff_sides
    from checks.env.render import render_diff
    from checks.env.view import load_side
    from checks.probe import LocalProbe

    cfg = settings(c)
    if not f.a:
        raise PreflightError("diff needs A", hint="e.g. invoke diff worked.json live")
    live = LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s).machine
    with interruptible():
        result = diff_sides(load_side(f.a, live), load_side(f.b or "live", live))
    emit(lambda _: render_diff(result, cfg.env.packages, every_row=f.all), result.to_json(), f.json)
    exit_with(result.exit_code())


@task(name="lock")
def env_lock(c: Context, f: fl.LockFlags) -> None:
    """Write the exact pins of this training environment (torch with its wheel index) to a lock file."""
    from checks.env.lock import LockRequest, make_lock

    if not f.out:
        raise PreflightError("lock needs --out FILE", hint="e.g. invoke lock --out env.lock")
    with interruptible():
        _, pins = make_lock(LockRequest(config=settings(c), out=Path(f.out), everything=f.all))
    print(f"wrote {f.out}: {len(pins)} pins; check a box with `invoke bootstrap --lock {f.out}`")


@task(name="sbatch")
def sbatch(c: Context, f: fl.SbatchFlags) -> None:
    """Print an sbatch script that runs bootstrap on every node of a job, then verify (your command after --)."""
    from checks.fileio import write_atomic
    from checks.fleet.sbatch import SbatchRequest, render

    python = sys.executable
    request = SbatchRequest(f.nodes, f.gpus_per_node, f.time, f.partition, f.account, str(CHECKOUT), python, f.command)
    text = render(request)
    if not f.out:
        sys.stdout.write(text)
        return
    write_atomic(Path(f.out), text, mode=0o755)
    print(f"wrote {f.out}: submit it with `sbatch {f.out}`")


# --- plan (checks/plan/) ------------------------------------------------------------------------------------


@task(name="plan")
def plan(c: Context, f: fl.PlanFlags) -> None:
    """Say which card, how many and what an epoch costs for a model: memory term by term, per card class."""
    from checks.plan.box import this_box
    from checks.plan.render import render_plan
    from checks.plan.request import PlanRequest
    from checks.plan.run import plan as make_plan

    request = fill(PlanRequest, f, config=settings(c), from_report=f.from_)
    check_output_path(f.json)
    box, ram = this_box(Path(f.machine) if f.machine else None)
    with interruptible():
        result = make_plan(request, box=box, ram_bytes=ram)
    emit(lambda _: render_plan(result), result.to_json(), f.json)


ns = Collection(
    bootstrap,
    snapshot,
    alloc_conf,
    stage_data,
    verify,
    watch,
    env_diff,
    env_lock,
    plan,
    sbatch,
    loaded_from=str(CHECKOUT),
)
ns.configure({"preflight": load_defaults()})
program.take_over(ns)  # run by `invoke`: the project's program takes the command line from here
