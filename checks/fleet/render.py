"""Render a fleet report as text: the hosts table, the TCP and RTT matrices, the all-reduce sweep, then every
result that is not ok (identical ones across hosts folded into one line), a tally and one call to action."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from checks.fleet.drift import drift_table, environments
from checks.fleet.report import FleetReport, Tagged
from checks.render import render_result
from checks.result import Result, Status
from checks.units import MIB

_ORDER = (Status.FAIL, Status.ERROR, Status.WARN)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def hosts_table(report: FleetReport) -> list[str]:
    rows = [["host", "status", "exit", "seconds", "ok", "warn", "fail", "skip", "error", "note"]]
    for h in report.hosts():
        c = h["counts"]
        # --install: the head of provision/venv.py's summary, what and where ("installed 27 distributions into ...")
        note = h["reason"] or (h.get("installed") or "").split(" (", 1)[0]
        exit_code = "-" if h["exit_code"] is None else str(h["exit_code"])
        rows.append(
            [
                h["host"],
                h["status"].upper() if h["status"] != "ok" else "ok",
                exit_code,
                f"{h['seconds']:.1f}",
                *(str(c[s]) for s in ("ok", "warn", "fail", "skip", "error")),
                note,
            ]
        )
    return ["hosts", *_table(rows)]


def matrices(report: FleetReport) -> list[str]:
    links = report.facts.links
    if not links:
        skipped = report.facts.links_skipped
        return [f"links: not measured ({skipped})"] if skipped else []
    names = [o.name for o in report.facts.hosts if any(o.name in (x.src, x.dst) for x in links)]
    rate = {(x.src, x.dst): x for x in links}
    tools = sorted({x.tool for x in links if x.tcp_mbit_s is not None})

    def cell(src: str, dst: str, field: str) -> str:
        link = rate.get((src, dst))
        if src == dst or link is None:
            return "-"
        value = getattr(link, field)
        return "error" if value is None else f"{value:.0f}" if field == "tcp_mbit_s" else f"{value:.2f}"

    out = [f"TCP Mbit/s, row sends to column ({', '.join(tools) or 'no figures'})"]
    out += _table([["", *names]] + [[s, *(cell(s, d, "tcp_mbit_s") for d in names)] for s in names])
    out += ["round-trip ms", *_table([["", *names]] + [[s, *(cell(s, d, "rtt_ms") for d in names)] for s in names])]
    return out


def sweep(report: FleetReport) -> list[str]:
    rows = report.facts.allreduce
    if not rows:
        return [f"all-reduce: {report.facts.allreduce_reason}"] if report.facts.allreduce_reason else []
    head = f"all-reduce ({rows[0].backend}, {rows[0].world_size} ranks)"
    table = [["size", "algbw GB/s", "busbw GB/s", "time ms"]]
    table += [
        [f"{r.bytes / MIB:.0f} MiB", f"{r.algbw_gb_s:.3f}", f"{r.busbw_gb_s:.3f}", f"{(r.seconds or 0) * 1000:.1f}"]
        for r in rows
    ]
    return [head, *_table(table)]


def folded(results: tuple[Tagged, ...]) -> list[tuple[str, Result]]:
    """Fail, error and warn results; the same finding on several hosts becomes one line naming them all."""
    groups: dict[tuple[str, str | None, Status, str], list[str]] = defaultdict(list)
    firsts: dict[tuple[str, str | None, Status, str], Result] = {}
    for host, r in results:
        if r.status not in _ORDER:
            continue
        key = (r.id, r.subject, r.status, r.summary)
        groups[key].append(host or "")
        firsts.setdefault(key, r)
    rows = [(",".join(h for h in hosts if h), firsts[key]) for key, hosts in groups.items()]
    return sorted(rows, key=lambda row: _ORDER.index(row[1].status))  # fails first; stable within a status


def call_to_action(report: FleetReport) -> str:
    for status in _ORDER:
        for host, r in report.results:
            if r.status is status:
                where = f" on {host}" if host else ""
                subject = f" ({r.subject})" if r.subject else ""
                return f"next: fix {r.id}{subject}{where}: {r.hint or r.summary}"
    return "next: nothing to fix; these hosts are ready to train together"


def render_fleet(report: FleetReport, colour: bool = False) -> str:
    """Render the fleet report as text."""
    f = report.facts
    lines = [f"gpu-preflight: fleet of {len(f.hosts)} hosts from {f.source} (controller {report.controller})"]
    lines += hosts_table(report) + matrices(report) + sweep(report)
    drift = drift_table(environments(report.measured))
    lines += ["environment drift (the columns that differ)", *_table(drift)] if drift else []
    shown = folded(report.results)
    named = [replace(r, id=r.id + (f" @{hosts}" if hosts else "")) for hosts, r in shown]
    width = max((len(r.id) + (len(r.subject) + 2 if r.subject else 0) for r in named), default=10)
    lines.append("problems (every result, ok and skipped too: --json)" if named else "no problems")
    for r in named:
        lines += render_result(r, colour, width)
    counts = report.counts()
    lines += ["", " · ".join(f"{n} {s}" for s, n in counts.items()), call_to_action(report)]
    return "\n".join(lines) + "\n"
