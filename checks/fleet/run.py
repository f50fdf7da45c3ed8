"""What ``invoke bootstrap --hosts`` runs: bootstrap on every host over SSH, the links and the all-reduce between
them, and the fleet report. It prints nothing (``notify`` carries progress lines) and picks no exit code.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from checks.config import PreflightConfig
from checks.fleet.report import FleetReport, build_fleet_report
from provision.hosts import HostSpec


@dataclass(frozen=True)
class FleetRequest:
    """Bootstrap of several hosts over SSH; ``source`` says where the host list came from."""

    config: PreflightConfig
    hosts: tuple[HostSpec, ...]
    source: str
    checkout: Path  # shipped to every host
    dry_run: bool = False
    lock: str = ""  # a lock file's text (bootstrap --lock): each host runs env-lock against it


def fleet(request: FleetRequest, notify: Callable[[str], None]) -> FleetReport:
    """Bootstrap every host over SSH, measure the links between them, report them together."""
    from provision.fanout import run_fleet  # fabric and paramiko load only for fleet runs

    hosts = list(request.hosts)
    facts = run_fleet(hosts, request.config, request.checkout, request.dry_run, notify, request.source, request.lock)
    return build_fleet_report(facts, request.config, platform.node())
