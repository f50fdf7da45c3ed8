"""What ``invoke bootstrap`` (one machine or a replayed snapshot) and ``invoke alloc-conf`` run.

Gather (the probe's facts and measurements, the allocator step of ``provision.alloc_env``), judge (every check of
the runner), and build the report. It prints nothing and picks no exit code: the task layer renders what it
returns. Several hosts are ``checks/fleet/run.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.measurements import measurements
from checks.machine.runner import CHECKS, Check, fed_by, measure, run_checks
from checks.probe import LocalProbe, Probe, SnapshotProbe
from checks.reports.bootstrap import BootstrapMeasurements
from checks.result import Report, Stopwatch, Timing
from provision import alloc_env

ALLOC_ONLY = tuple(item for item in CHECKS if item[0] == "alloc-conf")


@dataclass(frozen=True)
class BootstrapRequest:
    """One bootstrap of this machine (``machine`` None) or of a recorded snapshot."""

    config: PreflightConfig
    machine: Path | None = None
    dry_run: bool = False
    extra_checks: tuple[tuple[str, Check], ...] = ()  # run after the runner's own (the env-lock check of checks/env)


@dataclass(frozen=True)
class Bootstrapped:
    """The report, its measurements as the typed record its ``measurements`` were written from, and the allocator
    step's notes (diffs or files written) for the terminal."""

    report: Report
    measurements: BootstrapMeasurements
    notes: tuple[str, ...] = ()


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


def probe_for(machine: Path | None, cfg: PreflightConfig, clock: Stopwatch | None = None) -> Probe:
    """The live machine (its steps timed on ``clock``), or the snapshot file to replay."""
    if machine:
        return SnapshotProbe(machine)
    return LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s, clock=clock)


def bootstrap(request: BootstrapRequest) -> Bootstrapped:
    """Gather (measurements, the allocator step), judge every check, and build the report."""
    cfg, clock = request.config, Stopwatch()
    probe = probe_for(request.machine, cfg, clock)
    facts = measure(probe, probe.machine(), cfg)
    with clock.phase("allocator", ("alloc",)):  # the shell files written, and read back from a login shell
        alloc, notes, shell = alloc_env.alloc_step(
            probe,
            facts,
            cfg,
            dry_run=request.dry_run,
            apply=cfg.alloc_conf.apply,
            without_gpu=cfg.alloc_conf.without_gpu,
        )
    facts = dataclasses.replace(facts, alloc=alloc)
    checks = CHECKS + request.extra_checks
    with clock.phase("checks"):
        results = run_checks(facts, cfg, checks)
    measured = measurements(facts, cfg, notes)
    report = Report(
        host=facts.host.hostname,
        machine=probe.label,
        results=tuple(results),
        measurements=measured.to_json(),
        timing=_timing(clock.timing(replayed=not probe.live), checks),
    )
    return Bootstrapped(report=report, measurements=measured, notes=(*notes, *filter(None, [shell])))


def _timing(timing: Timing, checks: tuple[tuple[str, Check], ...]) -> Timing:
    """The run's timing, each gathering phase naming the rows it fed."""
    return dataclasses.replace(timing, phases=tuple(fed_by(p, checks) for p in timing.phases))


def alloc_conf(request: AllocConfRequest) -> AllocConfDone:
    """Write (or remove) the allocator block; after a write, prove a fresh login shell's torch reads it."""
    cfg = request.config
    paths = alloc_env.rc_paths(cfg.alloc_conf)
    if request.undo:
        changes = alloc_env.ensure_alloc_conf_removed(paths, dry_run=request.dry_run)
        return AllocConfDone(paths=tuple(paths), changes=tuple(changes), notes=(), report=None)
    probe = LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s)
    facts = probe.machine()
    alloc, notes, shell = alloc_env.alloc_step(probe, facts, cfg, dry_run=request.dry_run, apply=True, without_gpu=True)
    results = run_checks(dataclasses.replace(facts, alloc=alloc), cfg, checks=ALLOC_ONLY)
    report = Report(host=facts.host.hostname, machine=probe.label, results=tuple(results))
    return AllocConfDone(paths=tuple(paths), changes=(), notes=(*notes, *filter(None, [shell])), report=report)


@dataclass(frozen=True)
class AllocEnv:
    """The allocator variables bootstrap writes for new shells on this machine (empty: none, and ``reason`` why)."""

    variables: dict[str, str]
    reason: str = ""

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.variables.items()) or f"none ({self.reason})"


def allocator_env(facts: MachineFacts, cfg: PreflightConfig) -> AllocEnv:
    """What ``alloc_step`` would write here: verify's training child runs with it, as the real run will."""
    if not cfg.alloc_conf.apply:
        return AllocEnv({}, "preflight.alloc_conf.apply is false")
    if not cfg.alloc_conf.without_gpu and (reason := alloc_env.no_nvidia_gpu(facts)):
        return AllocEnv({}, reason)
    version = facts.torch.version
    value = alloc_env.choose_value(cfg.alloc_conf.value, version)
    return AllocEnv({var: value for var in alloc_env.variables_for(version)})
