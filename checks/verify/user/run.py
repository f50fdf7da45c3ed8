"""``invoke verify [flags] -- COMMAND [ARGS...]``: run the user's own training command unchanged and judge it.

gather (the command under the agent and the sampler) -> evaluate (``judge``) -> render (the task layer). Nothing
here prints: the command's own output passes through the streams the caller gives, progress goes to ``say``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, Any

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.probe.sample import GpuReader, HostReader
from checks.result import Report, Result
from checks.verify import plan as v
from checks.verify.run import Judged
from checks.verify.sampler import Sampler, Trace
from checks.verify.user import advice
from checks.verify.user import judge as j
from checks.verify.user.launch import CommandRun, StopRule, run_command
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


def rule(request: CommandRequest) -> StopRule:
    """The stop rule from the flags and the configuration (exit 2 on a bad value)."""
    cfg = request.config.verify
    steps = request.steps or cfg.steps
    warmup = cfg.warmup if request.warmup < 0 else request.warmup
    if steps < 1 or warmup < 1 or request.seconds < 0:
        raise PreflightError(
            "verify: --steps and --warmup must be at least 1 with a command (its first step includes start-up)"
        )
    return StopRule(warmup, steps, request.seconds, cfg.timeout_s, cfg.stall_timeout_s)


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


def verify_command(request: CommandRequest, say: Say) -> Judged:
    """Run the command under the agent and the sampler, stop it by the rules, judge it, write the files."""
    cfg, cwd = request.config, request.cwd or os.getcwd()
    executable(request.command, cwd)
    stop = rule(request)
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify)
    gate_rows: list[Result] | None = None
    if request.gate:
        from checks.probe import LocalProbe

        facts = LocalProbe(cfg.probe.torch_timeout_s).machine()
        gate_rows = v.gate(facts, cfg)
        cores, host = facts.host.usable_cores, facts.host.hostname
    else:
        cores, host = usable_here()
    plan = j.plan_for(cores, json_path, csv, png, request.price_per_hour or cfg.verify.price_per_hour)
    run, trace, gpu, gpu_error = _gather(request, stop, cwd, cores, say)
    if run.ended == "no-torch":
        raise PreflightError(
            f"verify: {' '.join(request.command)} never imported torch ({j.describe_exit(run.returncode)})",
            hint="verify -- COMMAND times torch training scripts; check that the command is the training one",
        )
    advice = _advice(request, run, stop, cwd, cores, say)
    results, measurements, verdicts = j.judge(
        run, trace, plan, cfg.verify, stop.warmup, stop.steps, stop.seconds, gate_rows, gpu, gpu_error, advice
    )
    steps = [s for r in j.ranks(run.events, stop.warmup, stop.steps, stop.seconds)[:1] for s in r.steps]
    title = f"invoke verify -- {request.command[0]}: {verdicts[0].id if verdicts else 'cant-tell'}"
    problems = v.write_outputs(
        csv, png, trace, title, gpu, cores, steps=steps, shares=measurements.get("step_breakdown"),
        comm_share=(measurements.get("ddp") or {}).get("comm_share"),
        step_s=(measurements.get("step_time") or {}).get("median_s"), samples_per_s=measurements.get("samples_per_s"),
    )  # fmt: skip
    report = Report(host=host, machine="live", results=tuple(results), measurements=measurements)
    return Judged(
        report=report,
        verdicts=tuple(verdicts),
        json_path=json_path,
        notes=(*problems, f"wrote {json_path}, {csv}, {png}"),
        interrupted=run.interrupted or bool((advice or {}).get("interrupted")),
        background=frozenset(r.id for r in gate_rows or []),
        focus="diagnosis",
    )


def _advice(
    request: CommandRequest, run: CommandRun, stop: StopRule, cwd: str, cores: float, say: Say
) -> dict[str, Any] | None:
    """For one process that waited for data: time candidate DataLoader settings on the command itself."""
    cfg = request.config.verify
    if cfg.command_advice_s <= 0 or run.interrupted or run.ended not in ("stopped", "exited"):
        return None
    found = j.ranks(run.events, stop.warmup, stop.steps, stop.seconds)
    if len(found) != 1 or found[0].loader is None:
        return None  # under torchrun every candidate would start every rank again: not measured
    lead = found[0]
    figs = j.rank_figures(lead)
    if figs is None or figs.fig.shares["data_wait"] < cfg.share_warn:
        return None
    say(f"verify: the command waited for data: timing DataLoader settings on it (up to {cfg.command_advice_s:g} s)")
    loader = lead.loader or {}
    return advice.measure(
        request.command, cwd, loader.get("asked") or {}, str(loader.get("site")), figs.fig.mean_s, cores,
        lead.device.get("type") == "cuda", cfg.command_advice_s, cfg.advice_min_gain,
    )  # fmt: skip


def _gather(
    request: CommandRequest, stop: StopRule, cwd: str, cores: float, say: Say
) -> tuple[CommandRun, Trace, int | None, str | None]:
    """The command under the sampler (NVML and the command's process tree)."""
    host = HostReader(usable=cores)
    gpu = GpuReader()
    found: dict[str, int | None] = {}
    shown: set[int] = set()

    def event(e: dict[str, object]) -> None:
        if e.get("event") == "device" and e.get("uuid") and "index" not in found:
            sampler.focus(str(e["uuid"]))
            found["index"] = gpu.index_of(str(e["uuid"]))
        if e.get("event") == "step" and isinstance(e.get("i"), int) and e.get("rank") in (0, None):
            i = int(e["i"])  # type: ignore[call-overload]
            if i not in shown and (i == stop.warmup or i % 10 == 0):
                shown.add(i)
                say(f"verify: step {i} ({'warm-up' if i <= stop.warmup else 'measured'})")

    def started(pid: int) -> None:
        host.pid = pid
        say(f"verify: started {' '.join(request.command)} (pid {pid})")

    stdout = subprocess.DEVNULL if request.quiet else (sys.stderr if request.json == "-" else None)
    echo = None if request.quiet else request.echo
    with ExitStack() as stack:
        sampler = stack.enter_context(Sampler(request.config.verify.sample_interval_s, gpu, host))
        run = run_command(request.command, stop, cwd, echo, stdout, None, event, started)
    return run, sampler.trace, found.get("index"), gpu.error
