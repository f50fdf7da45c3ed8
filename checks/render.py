"""Render a report as text for a terminal: pure functions, report in, string out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TextIO

from checks.result import Phase, Report, Result, Status, Timing

_COLOURS = {Status.OK: "32", Status.WARN: "33", Status.FAIL: "31", Status.SKIP: "2", Status.ERROR: "35"}
SKIP_GROUP_MIN = 3  # skips sharing one reason that are written as one line
SHOWN_S = 0.05  # a phase shorter than this rounds to 0.0: it goes into "other"


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


def render_text(
    report: Report,
    colour: bool = False,
    *,
    every_row: bool = False,
    background: frozenset[str] = frozenset(),
    focus: str | None = None,
    environment: str | None = None,
) -> str:
    """One line per result, a hint under each non-ok one, a tally and one call to action.

    Unless ``every_row``: skips that share their reason are one line ("18 skipped: no NVIDIA GPU visible"), and
    the ok and skipped rows of the ``background`` ids (bootstrap's checks inside verify) are one count line, so
    the rows that need the reader stand out. ``focus`` is the row the call to action names once nothing failed
    (verify's diagnosis). ``environment`` is bootstrap's one-line environment, shown under the header (its
    ``measurements.environment.summary``).
    """
    shown = [r for r in report.results if every_row or not _quiet(r, background)]
    width = max((len(r.id) + (len(r.subject) + 2 if r.subject else 0) for r in shown), default=10)
    lines = [f"gpu-preflight: {report.host} ({report.machine})"]
    if environment:
        lines.append(f"  environment: {environment}")
    quiet = [r for r in report.results if r not in shown]
    if quiet:
        tally = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r.status.value for r in quiet).items()))
        lines.append(f"  bootstrap's checks: {tally} (--all lists them); the rows below need a look")
    lines += _rows(shown, colour, width, every_row)
    counts = report.counts()
    lines.append("")
    lines.append(" · ".join(f"{n} {s}" for s, n in counts.items()))
    if report.timing is not None and report.timing.phases:
        lines.append(timing_line(report.timing))
    lines.append(call_to_action(report, focus))
    return "\n".join(lines) + "\n"


def _quiet(r: Result, background: frozenset[str]) -> bool:
    return r.id in background and r.status in (Status.OK, Status.SKIP)


def _rows(results: list[Result], colour: bool, width: int, every_row: bool) -> list[str]:
    """Each result's lines; without ``every_row``, a reason shared by several skips is written once, where the
    first of them stands."""
    by_reason: dict[str, list[Result]] = {}
    for r in results:
        if r.status is Status.SKIP:
            by_reason.setdefault(r.summary, []).append(r)
    lines: list[str] = []
    for r in results:
        group = by_reason.get(r.summary, []) if r.status is Status.SKIP and not every_row else []
        if len(group) < SKIP_GROUP_MIN:
            lines += render_result(r, colour, width)
        elif r is group[0]:
            ids = ", ".join(g.id + (f"[{g.subject}]" if g.subject else "") for g in group)
            lines.append(f"  {_label(Status.SKIP, colour)} {f'{len(group)} skipped':<{width}} {r.summary}: {ids}")
    return lines


def call_to_action(report: Report, focus: str | None = None) -> str:
    """The single most important next step: a failure first (what unblocks the rest), then ``focus``, then a
    warning."""
    fails = [r for r in report.results if r.status in (Status.FAIL, Status.ERROR)]
    first = _unblocking(fails) if fails else None
    if first is None and focus is not None:
        first = next((r for r in report.results if r.id == focus and r.status is not Status.SKIP), None)
    if first is None:
        first = next((r for r in report.results if r.status is Status.WARN), None)
    if first is None:
        if not any(r.id == "driver" for r in report.results):  # a part of the box was judged (alloc-conf, watch)
            return "next: nothing to fix here (invoke bootstrap judges the whole box)"
        return "next: nothing to fix; this box is ready to train"
    where = f" on {first.subject}" if first.subject else ""
    verb = "fix " if first.status is not Status.OK else ""
    return f"next: {verb}{first.id}{where}: {first.hint or first.summary}"


def _unblocking(fails: list[Result]) -> Result:
    """The failure to fix first. A box with no NVIDIA driver library at all is usually a CPU box (or a container
    given no GPU): the driver matters only where there is a GPU, so a missing torch is the step that unblocks
    the tool there."""
    no_driver = any(
        r.id == "driver" and isinstance(r.value, dict) and r.value.get("error_kind") == "library-not-found"
        for r in fails
    )
    if no_driver:
        torch = next((r for r in fails if r.id == "torch-build"), None)
        if torch is not None:
            return torch
    return next((r for r in fails if r.status is Status.FAIL), fails[0])


def timing_line(timing: Timing) -> str:
    """Where the run's own time went: "bootstrap took 5.3 s: torch probe 1.7 (environment 0.1 alongside), disks
    3.1, other 0.5". Phases that overlap are one term, the longest, with the others in brackets; the terms and
    "other" (what no phase shown covers) add up to the total."""
    terms: list[str] = []
    counted = 0.0
    for group in _overlapping(timing.phases):
        main = max(group, key=lambda p: p.seconds)
        if main.seconds < SHOWN_S:
            continue
        beside = [f"{p.name} {p.seconds:.1f}" for p in group if p is not main and p.seconds >= SHOWN_S]
        terms.append(f"{main.name} {main.seconds:.1f}" + (f" ({', '.join(beside)} alongside)" if beside else ""))
        counted += main.seconds
    if timing.seconds - counted >= SHOWN_S:
        terms.append(f"other {timing.seconds - counted:.1f}")
    return f"bootstrap took {timing.seconds:.1f} s: " + ", ".join(terms)


def _overlapping(phases: tuple[Phase, ...]) -> list[list[Phase]]:
    """The phases in groups that ran at once, in the order they started."""
    groups: list[list[Phase]] = []
    end = float("-inf")
    for p in sorted(phases, key=lambda p: p.start_s):
        if groups and p.start_s < end:
            groups[-1].append(p)
            end = max(end, p.start_s + p.seconds)
        else:
            groups.append([p])
            end = p.start_s + p.seconds
    return groups
