"""Render a report as text for a terminal: pure functions, report in, string out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from checks.result import Report, Result, Status

_COLOURS = {Status.OK: "32", Status.WARN: "33", Status.FAIL: "31", Status.SKIP: "2", Status.ERROR: "35"}
_ORDER = (Status.FAIL, Status.ERROR, Status.WARN)


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set and non-empty (https://no-color.org)."""
    return not environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def _label(status: Status, colour: bool) -> str:
    text = f"{status.value.upper():5}"
    return f"\033[{_COLOURS[status]}m{text}\033[0m" if colour else text


def render_result(r: Result, colour: bool, width: int) -> list[str]:
    name = r.id + (f"[{r.subject}]" if r.subject else "")
    first, *more = r.summary.split("\n")  # a multi-line summary (a matrix) continues under its first line
    lines = [f"  {_label(r.status, colour)} {name:<{width}} {first}"]
    lines += [f"  {'':5} {'':<{width}} {line}" for line in more]
    if r.status is not Status.OK and r.hint:
        lines.append(f"  {'':5} {'':<{width}} hint: {r.hint}")
    return lines


def render_text(report: Report, colour: bool = False) -> str:
    """One line per result, a hint under each non-ok one, a tally and one call to action."""
    width = max((len(r.id) + (len(r.subject) + 2 if r.subject else 0) for r in report.results), default=10)
    lines = [f"gpu-preflight: {report.host} ({report.machine})"]
    env = report.measurements.get("environment") or {}
    if env.get("summary"):  # bootstrap's one-line environment (checks/machine/measurements.py)
        lines.append(f"  environment: {env['summary']}")
    for r in report.results:
        lines += render_result(r, colour, width)
    counts = report.counts()
    lines.append("")
    lines.append(" · ".join(f"{n} {s}" for s, n in counts.items()))
    lines.append(call_to_action(report))
    return "\n".join(lines) + "\n"


def call_to_action(report: Report) -> str:
    """The single most important next step."""
    for status in _ORDER:
        first = next((r for r in report.results if r.status is status), None)
        if first is not None:
            where = f" on {first.subject}" if first.subject else ""
            return f"next: fix {first.id}{where}: {first.hint or first.summary}"
    return "next: nothing to fix; this box is ready to train"
