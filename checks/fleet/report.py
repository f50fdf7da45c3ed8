"""The fleet report of ``invoke bootstrap --hosts``: every host's results tagged with its name, the links and
the all-reduce between the hosts, and outliers against the fleet median (a host or GPU far below its peers).

JSON, schema 1: the single-host report (``checks/result.py``) extended::

    {"schema": 1, "tool": ..., "host": "<this machine>", "machine": "fleet of 4 hosts (--hosts)",
     "counts": {...all results...},
     "hosts": [{"host": "h1", "status": "ok" | "fail", "reason": null | "unreachable: ...",
                "exit_code": 1, "seconds": 12.3, "counts": {...},
                "installed": null | "installed 27 distributions into /root/.../.venv (how; kept ...): a-1 b-2"}],
     "results": [{...a result..., "host": "h1"},       # host null: about the fleet (links, all-reduce)
                 ...],
     "measurements": {"hosts": {"h1": {...that host's measurements...}},
                      "disks": [{"host": "h1", "path": ...}], "downloads": [{"host": ...}],
                      "links": [{"src", "dst", "tcp_mbit_s", "rtt_ms", "tool", "streams", "error"}],
                      "allreduce": [{"backend", "world_size", "bytes", "algbw_gb_s", "busbw_gb_s", ...}]}}
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from checks import TOOL_NAME, TOOL_VERSION
from checks.config import PreflightConfig
from checks.facts import FleetFacts, HostOutcome, LinkFacts
from checks.fleet.drift import drift_results, environments
from checks.machine.network import allreduce_results, link_results
from checks.reports.bootstrap import BootstrapMeasurements
from checks.result import REPORT_SCHEMA, Result, Status, fail, ok, warn

Tagged = tuple[str | None, Result]  # (host name or None for fleet-wide results, result)
Measured = Mapping[str, BootstrapMeasurements]  # each reporting host's measurements, typed, by host name
GPU_METRICS = (
    ("h2d_gb_s", "host-to-device GB/s"),
    ("d2h_gb_s", "device-to-host GB/s"),
    ("d2d_gb_s", "device copy GB/s"),
    ("matmul_tflops", "matmul TFLOPS"),
)


def _fail_hint(reason: str) -> str:
    hints = {
        "unreachable": "check that the host is up and that `ssh HOST` works from here",
        "authentication": "install your public key there (ssh-copy-id) or set IdentityFile in ~/.ssh/config",
        "host key": "the host's key changed: verify it, then update ~/.ssh/known_hosts",
        "no Python": "install Python 3.10+ there, or point hosts.python (or python= in a hosts file) at it",
        "too old": "use a Python 3.10+ there (hosts.python, or python= in a hosts file)",
        "dependencies": "bootstrap --hosts with --install, or install the dependencies with that Python (see the reason)",
        "died mid-run": "look at the host: out of memory, rebooted, or lost its network",
    }
    return next((h for key, h in hints.items() if key in reason), "see the reason; run bootstrap there by hand")


def host_results(o: HostOutcome) -> list[Tagged]:
    """Tag a host's results: its fail row, or its ok row followed by every result of its own report."""
    if o.status != "ok" or o.report is None:
        reason = o.reason or "no report"
        return [(o.name, fail("host-bootstrap", f"{o.name}: {reason}", _fail_hint(reason)))]
    head = ok(
        "host-bootstrap",
        f"bootstrap ran in {o.seconds:.1f} s (exit {o.exit_code}), "
        + (f"checkout copied by {o.shipped}" if o.shipped else "in its own task of the job")
        + (f"; {o.installed}" if o.installed else ""),
    )
    return [(o.name, head), *((o.name, r) for r in o.report.results)]


def measured_hosts(hosts: tuple[HostOutcome, ...]) -> dict[str, BootstrapMeasurements]:
    """Each reporting host's measurements, read once by the typed reader (the host's report was refused at the
    boundary, ``provision.fanout`` or the job's ``NodeRecord``, when they could not be)."""
    return {
        o.name: BootstrapMeasurements.from_json(o.report.measurements, f"{o.name}'s report.measurements")
        for o in hosts
        if o.report
    }


def _gpu_models(o: HostOutcome) -> dict[str, str]:
    rows = o.report.results if o.report else ()
    return {r.subject: str(r.value) for r in rows if r.id == "gpu-inventory" and r.subject}


def gpu_outliers(hosts: tuple[HostOutcome, ...], measured: Measured, fraction: float) -> list[Tagged]:
    """Flag GPUs far below the fleet median of the same model (needs figures from 2+ hosts)."""
    groups: dict[tuple[str, str], list[tuple[str, str, float]]] = defaultdict(list)
    for o in hosts:
        models = _gpu_models(o)
        bench = measured[o.name].gpu_bench if o.name in measured else None
        for row in bench or ():
            model = models.get(f"gpu{row.index}")
            for key, _ in GPU_METRICS:
                value = getattr(row, key)
                if model and value is not None:
                    groups[(model, key)].append((o.name, f"gpu{row.index}", float(value)))
    out: list[Tagged] = []
    for (model, key), values in groups.items():
        if len({h for h, _, _ in values}) < 2 or len(values) < 3:
            continue
        median = statistics.median(v for _, _, v in values)
        label = dict(GPU_METRICS)[key]
        for host, gpu, value in values:
            if value < fraction * median:
                summary = (
                    f"{host} {gpu} ({model}): {label} {value:g} is {value / median:.0%} of the fleet median {median:g}"
                )
                out.append(
                    (
                        host,
                        warn(
                            "fleet-outlier",
                            summary,
                            "this GPU is far below its peers: ask the provider",
                            subject=gpu,
                            value=value,
                        ),
                    )
                )
    return out


def _host_outliers(scores: dict[str, float], what: str, unit: str, fraction: float, hint: str) -> list[Tagged]:
    if len(scores) < 3:
        return []
    median = statistics.median(scores.values())
    return [
        (
            h,
            warn(
                "fleet-outlier",
                f"{h}: {what} {v:,.0f} {unit} is {v / median:.0%} of the fleet median {median:,.0f}",
                hint,
                subject=what,
                value=v,
            ),
        )
        for h, v in scores.items()
        if median > 0 and v < fraction * median
    ]


def link_scores(links: tuple[LinkFacts, ...]) -> dict[str, float]:
    """Score each host by the median TCP rate of the links it takes part in (either direction)."""
    per: dict[str, list[float]] = defaultdict(list)
    for link in links:
        if link.tcp_mbit_s is not None:
            per[link.src].append(link.tcp_mbit_s)
            per[link.dst].append(link.tcp_mbit_s)
    return {h: statistics.median(v) for h, v in per.items()}


def disk_scores(measured: Measured) -> dict[str, float]:
    """Score each host by the best cold read of its local locations."""
    scores = {}
    for name, m in measured.items():
        reads = [d.cold_read_mb_s for d in m.disks or () if d.local and d.cold_read_mb_s]
        if reads:
            scores[name] = float(max(reads))
    return scores


def fleet_results(f: FleetFacts, cfg: PreflightConfig, measured: Measured) -> list[Tagged]:
    """All results: per host, then links, all-reduce and outliers across the fleet."""
    tagged = [host_results(o) for o in f.hosts]
    out: list[Tagged] = [rows[0] for rows in tagged] + [t for rows in tagged for t in rows[1:]]  # host rows first
    out += [(None, r) for r in link_results(list(f.links), cfg.network)]
    names = [n for o in f.hosts if o.name in measured for n in measured[o.name].inventory.gpu_names]
    if f.allreduce or f.allreduce_reason:
        out += [
            (None, r)
            for r in allreduce_results(list(f.allreduce), f.allreduce_reason, list(f.links), names, cfg.network)
        ]
    fraction = cfg.hosts.outlier_fraction
    out += _host_outliers(
        link_scores(f.links), "links", "Mbit/s", fraction, "this host's network is slower than its peers'"
    )
    out += _host_outliers(
        disk_scores(measured), "disk", "MB/s", fraction, "this host's local disk is slower than its peers'"
    )
    out += gpu_outliers(f.hosts, measured, cfg.bench.outlier_fraction)
    out += drift_results(environments(measured))  # torch, CUDA build, NCCL, Python, packages (checks/fleet/drift.py)
    return out


@dataclass(frozen=True)
class FleetReport:
    """All results of a fleet run, tagged with their host, and the measurements behind them (``measured``: each
    reporting host's, typed)."""

    controller: str
    facts: FleetFacts
    results: tuple[Tagged, ...]
    measured: Measured

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for _, r in self.results:
            counts[r.status.value] += 1
        return counts

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing is worse than warn; 1 on any fail or error, any host included (or warn, strict)."""
        bad = {Status.FAIL, Status.ERROR} | ({Status.WARN} if strict else set())
        return 1 if any(r.status in bad for _, r in self.results) else 0

    def hosts(self) -> list[dict[str, Any]]:
        by_host: dict[str | None, dict[str, int]] = {o.name: {s.value: 0 for s in Status} for o in self.facts.hosts}
        for host, r in self.results:  # one pass: at 1,000 hosts a pass per host took 3.4 s (bench_fleet_scale.py)
            if host in by_host:
                by_host[host][r.status.value] += 1
        rows = []
        for o in self.facts.hosts:
            counts = by_host[o.name]
            rows.append(
                {
                    "host": o.name,
                    "status": o.status,
                    "reason": o.reason,
                    "exit_code": o.exit_code,
                    "seconds": o.seconds,
                    "installed": o.installed,
                    "counts": counts,
                }
            )
        return rows

    def measurements(self) -> dict[str, Any]:
        """Each host's measurements as it wrote them, its disk and download rows tagged with its name, the links
        and the all-reduce between the hosts."""
        per = {o.name: dict(o.report.measurements) for o in self.facts.hosts if o.report}
        disks = [{"host": h, **row.to_json()} for h, m in self.measured.items() for row in m.disks or ()]
        downloads = [{"host": h, **row.to_json()} for h, m in self.measured.items() for row in m.downloads or ()]
        return {
            "hosts": per,
            "disks": disks,
            "downloads": downloads,
            "links": [asdict(x) for x in self.facts.links],
            "allreduce": [asdict(x) for x in self.facts.allreduce],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "tool": f"{TOOL_NAME} {TOOL_VERSION}",
            "host": self.controller,
            "machine": f"fleet of {len(self.facts.hosts)} hosts ({self.facts.source})",
            "counts": self.counts(),
            "hosts": self.hosts(),
            "results": [{**r.to_json(), "host": h} for h, r in self.results],
            "measurements": self.measurements(),
        }


def build_fleet_report(f: FleetFacts, cfg: PreflightConfig, controller: str) -> FleetReport:
    measured = measured_hosts(f.hosts)
    return FleetReport(controller, f, tuple(fleet_results(f, cfg, measured)), measured)
