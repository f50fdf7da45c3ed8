"""What ``invoke verify`` and ``invoke watch`` run, from validated flags to the written files and the report.

Nothing here prints or picks an exit code: progress goes to the caller's ``say`` callback, and the task layer
renders the returned report and verdicts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from checks.config import PreflightConfig, VerifyConfig
from checks.errors import PreflightError
from checks.probe import LocalProbe
from checks.probe.launch import launch_context
from checks.reports.verify import Measurements
from checks.result import Report, Result, ok
from checks.verify import plan as v
from checks.verify import stop as rule
from checks.verify import watch as w
from checks.verify.contract import ChildResult, EstimateEvent, Event, StopSpec
from checks.verify.diagnosis import Verdict
from checks.verify.distributed import describe as describe_ddp

Say = Callable[[str], None]


@dataclass(frozen=True)
class VerifyRequest:
    """``invoke verify``: the configuration and the task's flags."""

    config: PreflightConfig
    options: v.Options
    budget: str = ""  # --budget as typed ("": preflight.verify.budget)


@dataclass(frozen=True)
class WatchRequest:
    """``invoke watch``: sample for ``seconds`` (0: the configured time), judging ``pid``'s tree (0: the machine)."""

    config: PreflightConfig
    seconds: int = 0
    pid: int = 0
    json: str = ""
    plot: str = ""


@dataclass(frozen=True)
class Judged:
    """A finished verify or watch: the report, its verdicts, where it goes, and what the terminal should hear."""

    report: Report
    verdicts: tuple[Verdict, ...]
    json_path: str  # "-": stdout
    notes: tuple[str, ...]  # files that could not be written, then the files written
    interrupted: bool
    background: frozenset[str] = frozenset()  # bootstrap's ids (the gate): their ok/skip rows print as one count
    focus: str | None = None  # the row the call to action names once nothing failed


def verify(request: VerifyRequest, say: Say) -> Judged:
    """Plan the smoke run, gate on bootstrap's fast checks, train under the sampler, judge it, write the files."""
    from checks.verify.report import judge

    started = time.monotonic()
    cfg = request.config
    budget = budget_s(request.budget, cfg.verify)
    with ExitStack() as stack:
        machine = LocalProbe(cfg.probe.torch_timeout_s).machine
        p, facts = v.plan(request.options, cfg, machine, stack, launch_context())
        gate = v.gate(facts, cfg, p.spec.device)
        if p.spec.ddp:
            say(describe_ddp(p.spec.ddp, p.usable_cores, p.node))
        p = budgeted(p, cfg.verify, bool(request.options.steps), started + budget, budget)
        outcome = v.run(p, cfg, lambda e: _say(say, progress(e, budget)))
        v.raise_usage(outcome)
        results, measurements, verdicts = judge(p, outcome, cfg.verify, gate)
        child = outcome.child.result or ChildResult()
        title = f"invoke verify: {verdicts[0].id if verdicts else 'cant-tell'}"
        steps = measurements.steps
        problems = v.write_outputs(
            p.csv_path, p.png_path, outcome.trace, title, outcome.gpu_index, p.usable_cores,
            steps=[s.to_json() for s in child.steps], warmup=[s.to_json() for s in child.warmup],
            shares=steps.step_breakdown if steps else None, phases=child.timeline,
            comm_share=measurements.ddp.comm_share if measurements.ddp else None,
            step_s=steps.step_time.median_s if steps else None,
            samples_per_s=(steps.samples_per_s_with_checkpoints or steps.samples_per_s) if steps else None,
        )  # fmt: skip
    if p.spec.stop is not None:
        results, measurements = _timed(results, measurements, child, budget, time.monotonic() - started)
    report = Report(
        host=facts.host.hostname, machine="live", results=tuple(gate + results), measurements=measurements.to_json()
    )
    notes = (*problems, f"wrote {p.json_path}, {p.csv_path}, {p.png_path}")
    return Judged(
        report=report,
        verdicts=tuple(verdicts),
        json_path=p.json_path,
        notes=notes,
        interrupted=outcome.child.interrupted,
        background=frozenset(r.id for r in gate),
        focus="diagnosis",
    )


def watch(request: WatchRequest, say: Say, progress: Say | None = None) -> Judged:
    """Sample GPU and CPU use for a while (Ctrl-C stops early), judge them, write the CSV and the PNG;
    ``progress`` gets what the sampling has seen so far, about once a second."""
    cfg = request.config
    w.check_pid(request.pid)
    if request.seconds < 0:
        raise PreflightError(f"--seconds must be positive, got {request.seconds}")
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify, "watch")
    usable, host = w.usable_here()
    seconds = request.seconds or cfg.verify.watch_seconds
    say(f"watch: sampling for {seconds} s (Ctrl-C stops early)")
    watched = w.sample(seconds, request.pid or None, usable, cfg.verify, progress)
    found = w.verdicts(watched, cfg.verify, usable)
    results, measurements = w.results(watched, found, usable, str(csv))
    measurements["files"] = {"json": json_path, "csv": str(csv), "png": str(png)}
    problems = v.write_outputs(csv, png, watched.trace, f"invoke watch: {found[0].id}", watched.gpu, usable)
    report = Report(host=host, machine="live", results=tuple(results), measurements=measurements)
    notes = (*problems, f"wrote {json_path}, {csv}, {png}")
    return Judged(
        report=report,
        verdicts=tuple(found),
        json_path=json_path,
        notes=notes,
        interrupted=watched.interrupted,
        focus="diagnosis",
    )


def _say(say: Say, line: str | None) -> None:
    if line:
        say(line)


def budget_s(typed: str, cfg: VerifyConfig) -> float:
    """The whole command's seconds: ``--budget`` as typed, else ``verify.budget``; 0, negative or not a number
    exits 2 (a typed value is never replaced by another)."""
    where = "--budget" if typed.strip() else "preflight.verify.budget"
    text = typed.strip() or repr(cfg.budget)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PreflightError(
            f"verify: {where} must be a number of seconds above 0, got {text}",
            hint="the wall time for the whole verify, e.g. --budget 300; --steps N measures exactly N steps",
        )
    return value


def budgeted(p: v.Plan, cfg: VerifyConfig, forced: bool, deadline: float, budget: float) -> v.Plan:
    """The plan with the budget and the stop rule in its spec (``checks/verify/stop.py``); unchanged under several
    processes, where every rank runs ``verify.steps`` (the ranks must stop together)."""
    if p.spec.ddp is not None:
        return p
    stop = StopSpec(
        min_steps=cfg.critical_min_steps,
        width=cfg.stable_width,
        batches=cfg.stable_batches,
        budget_s=budget,
        deadline=deadline - rule.TAIL_S,
        measure_s=cfg.measure_budget_s,
        forced=forced,
    )
    return dataclasses.replace(p, spec=dataclasses.replace(p.spec, stop=stop))


def progress(event: Event, budget: float) -> str | None:
    """``plan.progress``, and after the warm-up the time the rest will take."""
    if not isinstance(event, EstimateEvent):
        return v.progress(event)
    low = event.least * event.step_s + event.rest_s + rule.TAIL_S
    high = event.most * event.step_s + event.rest_s + rule.TAIL_S
    span = f"{low:.0f} s" if event.least == event.most else f"{low:.0f}-{high:.0f} s"
    steps = f"{event.most}" if event.least == event.most else f"{event.least} to {event.most}"
    stops = "" if event.least == event.most else ", stopping once the shares are stable"
    left = f"; {event.left_s:.0f} s of the {budget:g} s budget left" if event.left_s else ""
    return (
        f"verify: warm-up done, {event.step_s:.2f} s a step: about {span} more ({steps} measured steps{stops}, "
        f"then the rest){left}"
    )


def _timed(
    results: list[Result], m: Measurements, child: ChildResult, budget: float, seconds: float
) -> tuple[list[Result], Measurements]:
    """Add the ``verify-time`` row after ``verify-loop`` and ``measurements.time_to_verdict``."""
    facts = child.stop
    estimate = facts.estimate_s if facts is not None else None
    block = rule.time_to_verdict(budget, seconds, facts, child.cuts, estimate)
    row = ok("verify-time", rule.summary(budget, seconds, facts, child.cuts), value=round(seconds, 1))
    at = next((i + 1 for i, r in enumerate(results) if r.id == "verify-loop"), len(results))
    return [*results[:at], row, *results[at:]], dataclasses.replace(m, time_to_verdict=block)
