"""``invoke bootstrap --hosts``: bootstrap every host in parallel over SSH, then measure the links between them
and an all-reduce across them, and hand back everything the fleet report needs.

Per host, the one host flow (``provision.flow``: connect, check Python, claim the checkout directory, ship the
checkout, ``--install``) -> run ``python -m invoke -f <this run's config> bootstrap --json`` there with the
host's own Python -> read the JSON back. Any failure on the way is that host's one fail row; the other hosts
go on. Ctrl-C stops every remote process this run started (by PID) and removes its temporary directories.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from checks.config import PreflightConfig
from checks.facts import FleetFacts, HostOutcome
from checks.reports.bootstrap import BootstrapMeasurements
from checks.result import Report
from checks.typedjson import TypedJsonError
from provision.flow import Hosts, Ready, in_parallel, module_script
from provision.hosts import HostSpec
from provision.remote import Prepared, RemoteError, Session, Stopped
from provision.remote_net import measure_allreduce, measure_links
from provision.venv import install_note

Notify = Callable[[str], None]


def config_yaml(cfg: PreflightConfig) -> bytes:
    """Dump this run's whole configuration, so every host judges with the same keys and thresholds."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return list(value) if isinstance(value, tuple) else value

    return yaml.safe_dump({"preflight": plain(dataclasses.asdict(cfg))}, sort_keys=False).encode()


def _failure(done: Any, python: str, directory: str) -> str:
    err = done.err.strip()
    last = err.splitlines()[-1] if err else ""
    missing = re.search(r"No module named '?([\w.]+)", err)
    if missing:
        return (
            # --install first: a system Python (Debian 12, Ubuntu 23.04+) refuses `pip install` (PEP 668)
            f"the remote Python lacks gpu-preflight's dependencies (No module named '{missing.group(1)}'): "
            f"bootstrap with --install (a virtualenv next to the checkout), or run "
            f"`cd {directory} && {python} -m pip install .` there"
        )
    if done.code == 2:
        return f"bootstrap refused to run: {last}"
    if done.code == 130:
        return "bootstrap was interrupted there"
    if done.code < 0 or done.code > 128:
        return "died mid-run: bootstrap was killed" + (f" (signal {done.code - 128})" if done.code > 128 else "")
    return f"bootstrap {'left no report' if done.code == 1 else 'crashed'} (exit {done.code}): {last}"


def run_bootstrap(
    session: Session, prepared: Prepared, cfg: PreflightConfig, dry_run: bool, lock: str = ""
) -> tuple[int, Report]:
    """Run bootstrap on the host; return its exit code and JSON report. ``lock``: a lock file's text, sent to
    the host's temporary directory and checked there (env-lock), as ``bootstrap --lock`` does on one box."""
    tmp = shlex.quote(prepared.tmp)
    if lock:
        session.run(f"cat > {tmp}/env.lock", 30, stdin=lock.encode())
    remote_lock = f"{prepared.tmp}/env.lock" if lock else ""
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, lock=remote_lock))  # never this box's path
    session.run(f"cat > {tmp}/config.yaml", 30, stdin=config_yaml(cfg))
    args = ["-f", f"{prepared.tmp}/config.yaml", "bootstrap", "--json", f"{prepared.tmp}/report.json"]
    script = module_script(prepared, "invoke", [*args, *(["--dry-run"] if dry_run else [])]) + " >/dev/null"
    done = session.run(script, cfg.hosts.run_timeout_s, track=True)
    report = session.run(f"cat {tmp}/report.json 2>/dev/null", 30) if done.code in (0, 1) else None
    try:
        data = json.loads(report.out if report else "")
    except ValueError:  # exit 1 without a report: python -m invoke itself failed (no invoke, say)
        raise RemoteError(_failure(done, prepared.python, prepared.directory)) from None
    where = f"{prepared.tmp}/report.json"
    try:
        read = Report.from_json(data, where)
        BootstrapMeasurements.from_json(read.measurements, f"{where}.measurements")
    except TypedJsonError as exc:  # the copy shipped there is this checkout: a report it cannot read is a bug
        raise RemoteError(f"bootstrap's report there cannot be read: {exc}") from None
    return done.code, read


def bootstrap_host(
    spec: HostSpec, cfg: PreflightConfig, root: Path, dry_run: bool, hosts: Hosts, lock: str = ""
) -> tuple[HostOutcome, Ready | None]:
    """Take one host from connection to report; every failure becomes the outcome's reason."""
    start = time.monotonic()
    try:
        host = hosts.ready(spec, cfg, root)
        code, report = run_bootstrap(host.session, host.prepared, cfg, dry_run, lock)
    except RemoteError as exc:
        return HostOutcome(spec.name, "fail", str(exc), None, round(time.monotonic() - start, 2)), None
    except Stopped:
        raise
    except Exception as exc:  # noqa: BLE001 - one host's trouble is its fail row, never the others' abort
        reason = f"died mid-run: {type(exc).__name__}: {exc}"
        return HostOutcome(spec.name, "fail", reason, None, round(time.monotonic() - start, 2)), None
    seconds = round(time.monotonic() - start, 2)
    return HostOutcome(spec.name, "ok", None, report, seconds, code, host.shipped, host.installed), host


def run_fleet(
    specs: list[HostSpec], cfg: PreflightConfig, root: Path, dry_run: bool, notify: Notify, source: str, lock: str = ""
) -> FleetFacts:
    """Bootstrap every host (each checked against ``lock``, a lock file's text, when given), then links and
    all-reduce across those that ran; clean up on every way out."""
    with Hosts() as hosts:
        try:
            jobs = [partial(bootstrap_host, s, cfg, root, dry_run, hosts, lock) for s in specs]
            results = [f.result() for f in in_parallel(jobs, cfg.hosts.parallel, hosts.stop)]
            for outcome, _ in results:
                done = f"{install_note(outcome.installed)}; " if outcome.installed else ""
                notify(f"{outcome.name}: {outcome.reason or f'{done}bootstrap done in {outcome.seconds:.0f} s'}")
            ran = [host for o, host in results if o.status == "ok" and host is not None]
            links, links_skipped = measure_links(ran, cfg.network, notify)
            reports = {o.name: o.report for o, _ in results if o.report}
            allreduce, allreduce_skipped = measure_allreduce(ran, reports, links, cfg.network, notify)
        except Stopped:
            raise KeyboardInterrupt from None
    return FleetFacts(
        tuple(o for o, _ in results), tuple(links), links_skipped, tuple(allreduce), allreduce_skipped, source
    )
