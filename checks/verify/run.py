"""What ``invoke verify`` and ``invoke watch`` run, from validated flags to the written files and the report.

Nothing here prints or picks an exit code: progress goes to the caller's ``say`` callback, and the task layer
renders the returned report and verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from checks.config import PreflightConfig, VerifyConfig
from checks.errors import PreflightError
from checks.result import Report
from checks.verify import plan as v
from checks.verify import watch as w
from checks.verify.diagnosis import Verdict

Say = Callable[[str], None]


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
