"""What ``invoke bootstrap`` and ``invoke alloc-conf`` run: this machine, a replayed snapshot, or several hosts.

The orchestration sits here, above the rules, because it is the one layer that reaches all it needs: bootstrap's
checks and measurements (``checks.machine``), the allocator step that writes the shell start-up files
(``provision.alloc_env``) and the per-host measurements the fleet report reads back from every host
(``checks.fleet.report``). It prints nothing and picks no exit code: the task layer renders what it returns.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.fleet.report import FleetReport, build_fleet_report, host_measurements
from checks.machine.resources import loader_advice
from checks.machine.runner import CHECKS, measure, run_checks
from checks.probe import LocalProbe, Probe, SnapshotProbe
from checks.result import Report
from checks.snapshot import to_jsonable
from provision import alloc_env
from provision.hosts import HostSpec

ALLOC_ONLY = tuple(item for item in CHECKS if item[0] == "alloc-conf")


@dataclass(frozen=True)
class BootstrapRequest:
    """One bootstrap of this machine (``machine`` None) or of a recorded snapshot."""

    config: PreflightConfig
    machine: Path | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class Bootstrapped:
    """The report, and the allocator step's notes (diffs or files written) for the terminal."""

    report: Report
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetRequest:
    """Bootstrap of several hosts over SSH; ``source`` says where the host list came from."""

    config: PreflightConfig
    hosts: tuple[HostSpec, ...]
    source: str
    checkout: Path  # shipped to every host
    dry_run: bool = False


@dataclass(frozen=True)
class AllocConfRequest:
    """``invoke alloc-conf``: write the allocator block (or take it out with ``undo``)."""

    config: PreflightConfig
    dry_run: bool = False
    undo: bool = False


@dataclass(frozen=True)
class AllocConfDone:
    """What alloc-conf changed; ``report`` is the read-back (None for ``undo``)."""

    paths: tuple[Path, ...]
    changes: tuple[alloc_env.Change, ...]
    notes: tuple[str, ...]
    report: Report | None


def probe_for(machine: Path | None, cfg: PreflightConfig) -> Probe:
    """The live machine, or the snapshot file to replay."""
    return SnapshotProbe(machine) if machine else LocalProbe(cfg.probe.torch_timeout_s)


def measurements(facts: MachineFacts, cfg: PreflightConfig, notes: list[str]) -> dict[str, Any]:
    """The report's ``measurements``: DataLoader advice, benchmarks, PCIe under load, the host's figures."""
    out: dict[str, Any] = {"dataloader": loader_advice(facts, cfg).as_dict()}
    if facts.bench is not None and facts.bench.gpus:
        out["gpu_bench"] = to_jsonable(facts.bench.gpus)
    links = {
        f"gpu{g.index}": {"gen": g.pcie_gen_loaded, "width": g.pcie_width_loaded}
        for g in facts.nvml.gpus
        if g.pcie_gen_loaded
    }
    if links:
        out["pcie_under_load"] = links
    if notes:
        out["alloc_conf_changes"] = notes
    out.update(host_measurements(facts))  # disks, mounts, downloads, inventory
    return out


def bootstrap(request: BootstrapRequest) -> Bootstrapped:
    """Gather (measurements, the allocator step), judge every check, and build the report."""
    cfg = request.config
    probe = probe_for(request.machine, cfg)
    facts = measure(probe, probe.machine(), cfg)
    alloc, notes = alloc_env.alloc_step(probe, facts, cfg, dry_run=request.dry_run, apply=cfg.alloc_conf.apply)
    facts = dataclasses.replace(facts, alloc=alloc)
    results = run_checks(facts, cfg)
    report = Report(
        host=facts.host.hostname,
        machine=probe.label,
        results=tuple(results),
        measurements=measurements(facts, cfg, notes),
    )
    return Bootstrapped(report=report, notes=tuple(notes))


def fleet(request: FleetRequest, notify: Callable[[str], None]) -> FleetReport:
    """Bootstrap every host over SSH, measure the links between them, report them together."""
    from provision.fanout import run_fleet  # fabric and paramiko load only for fleet runs

    hosts = list(request.hosts)
    facts = run_fleet(hosts, request.config, request.checkout, request.dry_run, notify, request.source)
    return build_fleet_report(facts, request.config, platform.node())


def alloc_conf(request: AllocConfRequest) -> AllocConfDone:
    """Write (or remove) the allocator block; after a write, prove a fresh login shell's torch reads it."""
    cfg = request.config
    paths = alloc_env.rc_paths(cfg.alloc_conf)
    if request.undo:
        changes = alloc_env.ensure_alloc_conf_removed(paths, dry_run=request.dry_run)
        return AllocConfDone(paths=tuple(paths), changes=tuple(changes), notes=(), report=None)
    probe = LocalProbe(cfg.probe.torch_timeout_s)
    facts = probe.machine()
    alloc, notes = alloc_env.alloc_step(probe, facts, cfg, dry_run=request.dry_run, apply=True)
    results = run_checks(dataclasses.replace(facts, alloc=alloc), cfg, checks=ALLOC_ONLY)
    report = Report(host=facts.host.hostname, machine=probe.label, results=tuple(results))
    return AllocConfDone(paths=tuple(paths), changes=(), notes=tuple(notes), report=report)
