"""What ``invoke verify`` and ``invoke watch`` run, from validated flags to the written files and the report.

Nothing here prints or picks an exit code: progress goes to the caller's ``say`` callback, and the task layer
renders the returned report and verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.probe import LocalProbe
from checks.result import Report
from checks.verify import plan as v
from checks.verify import watch as w
from checks.verify.contract import ChildResult
from checks.verify.diagnosis import Verdict
from checks.verify.distributed import describe as describe_ddp

Say = Callable[[str], None]


@dataclass(frozen=True)
class VerifyRequest:
    """``invoke verify``: the configuration and the task's flags."""

    config: PreflightConfig
    options: v.Options


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

    cfg = request.config
    with ExitStack() as stack:
        p, facts = v.plan(request.options, cfg, LocalProbe(cfg.probe.torch_timeout_s).machine, stack)
        gate = v.gate(facts, cfg, p.spec.device)
        if p.spec.ddp:
            say(describe_ddp(p.spec.ddp, p.usable_cores))
        outcome = v.run(p, cfg, lambda e: _say(say, v.progress(e)))
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


def watch(request: WatchRequest, say: Say) -> Judged:
    """Sample GPU and CPU use for a while (Ctrl-C stops early), judge them, write the CSV and the PNG."""
    cfg = request.config
    w.check_pid(request.pid)
    if request.seconds < 0:
        raise PreflightError(f"--seconds must be positive, got {request.seconds}")
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify, "watch")
    usable, host = w.usable_here()
    seconds = request.seconds or cfg.verify.watch_seconds
    say(f"watch: sampling for {seconds} s (Ctrl-C stops early)")
    watched = w.sample(seconds, request.pid or None, usable, cfg.verify)
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
