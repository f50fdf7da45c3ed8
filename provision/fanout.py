"""``invoke bootstrap --hosts``: bootstrap every host in parallel over SSH, then measure the links between them
and an all-reduce across them, and hand back everything the fleet report needs.

Per host: connect (fabric, the user's SSH config) -> check Python and claim the checkout directory -> ship the
checkout (rsync, else tar) -> run ``python -m invoke -f <this run's config> bootstrap --json`` there with the
host's own Python -> read the JSON back. Any failure on the way is that host's one fail row; the other hosts
go on. Ctrl-C stops every remote process this run started (by PID) and removes its temporary directories.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import yaml

from checks.config import PreflightConfig
from checks.facts import FleetFacts, HostOutcome
from provision.hosts import HostSpec
from provision.remote import Prepared, RemoteError, Session, Stopped, connect, remote_path
from provision.remote_net import measure_allreduce, measure_links
from provision.ship import prepare_script, ship
from provision.venv import ensure_venv, install_note, requirements

Notify = Callable[[str], None]


def python_text(spec: HostSpec, cfg: PreflightConfig) -> str:
    python = spec.python or cfg.hosts.python
    return remote_path(python) if "/" in python else shlex.quote(python)


def prepare(session: Session, cfg: PreflightConfig) -> Prepared:
    """Check the host's Python (3.10+), claim the checkout directory, find rsync and iperf3."""
    python = session.spec.python or cfg.hosts.python
    done = session.run(prepare_script(cfg.hosts.remote_dir, python), 60)
    lines = dict(line.split(" ", 1) for line in done.out.splitlines() if " " in line)
    if "nopython" in done.out:
        raise RemoteError(f"no Python: {python!r} is not on PATH there (set hosts.python, or python= in a hosts file)")
    version = lines.get("python", "0.0")
    if tuple(int(x) for x in version.split(".")) < (3, 10):
        raise RemoteError(f"Python {version} ({python}) is too old: gpu-preflight needs 3.10 or newer")
    if "notours" in done.out:
        raise RemoteError(f"{lines.get('dir')} holds other files: refusing to sync into it (set hosts.remote_dir)")
    if done.code != 0 or "dir" not in lines or "tmp" not in lines:
        raise RemoteError(f"cannot create {cfg.hosts.remote_dir} there: {done.err.strip()[-200:]}")
    with session.lock:
        session.temp_dirs.add(lines["tmp"])
    return Prepared(
        python_text(session.spec, cfg),
        lines["dir"],
        lines["tmp"],
        lines.get("rsync") == "yes",
        lines.get("iperf3") == "yes",
    )


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
) -> tuple[int, dict]:
    """Run bootstrap on the host; return its exit code and JSON report. ``lock``: a lock file's text, sent to
    the host's temporary directory and checked there (env-lock), as ``bootstrap --lock`` does on one box."""
    tmp = shlex.quote(prepared.tmp)
    if lock:
        session.run(f"cat > {tmp}/env.lock", 30, stdin=lock.encode())
    remote_lock = f"{prepared.tmp}/env.lock" if lock else ""
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, lock=remote_lock))  # never this box's path
    session.run(f"cat > {tmp}/config.yaml", 30, stdin=config_yaml(cfg))
    flags = " --dry-run" if dry_run else ""
    script = (
        f"cd {shlex.quote(prepared.directory)} && exec env -u SLURM_JOB_NODELIST {prepared.python} -m invoke "
        f"-f {tmp}/config.yaml bootstrap --json {tmp}/report.json{flags} >/dev/null"
    )
    done = session.run(script, cfg.hosts.run_timeout_s, track=True)
    report = session.run(f"cat {tmp}/report.json 2>/dev/null", 30) if done.code in (0, 1) else None
    try:
        return done.code, dict(json.loads(report.out if report else ""))
    except ValueError:  # exit 1 without a report: python -m invoke itself failed (no invoke, say)
        raise RemoteError(_failure(done, prepared.python, prepared.directory)) from None


def bootstrap_host(
    spec: HostSpec,
    cfg: PreflightConfig,
    root: Path,
    dry_run: bool,
    sessions: dict[str, Session],
    stop: threading.Event,
    lock: str = "",
) -> tuple[HostOutcome, Prepared | None]:
    """Take one host from connection to report; every failure becomes the outcome's reason."""
    start, prepared = time.monotonic(), None
    try:
        session = connect(spec, cfg.hosts, stop)
        sessions[spec.name] = session
        prepared = prepare(session, cfg)
        shipped = ship(
            session, root, prepared.directory, prepared.rsync, (cfg.hosts.connect_timeout_s, cfg.hosts.dead_after_s)
        )
        installed = None
        if cfg.hosts.install:
            venv = ensure_venv(session, prepared.directory, prepared.python, requirements(root), cfg.hosts.wheelhouse)
            prepared, installed = dataclasses.replace(prepared, python=shlex.quote(venv.python)), venv.summary
        code, report = run_bootstrap(session, prepared, cfg, dry_run, lock)
    except RemoteError as exc:
        return HostOutcome(spec.name, "fail", str(exc), None, round(time.monotonic() - start, 2)), prepared
    except Stopped:
        raise
    except Exception as exc:  # noqa: BLE001 - one host's trouble is its fail row, never the others' abort
        reason = f"died mid-run: {type(exc).__name__}: {exc}"
        return HostOutcome(spec.name, "fail", reason, None, round(time.monotonic() - start, 2)), prepared
    outcome = HostOutcome(spec.name, "ok", None, report, round(time.monotonic() - start, 2), code, shipped, installed)
    return outcome, prepared


def _gather(futures: dict[Future[Any], HostSpec]) -> list[Any]:
    """Wait for all futures with short sleeps, so Ctrl-C reaches the main thread at once."""
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
    return [f.result() for f in futures]


def _cleanup(sessions: dict[str, Session]) -> None:
    threads = [threading.Thread(target=s.cleanup, daemon=True) for s in sessions.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    for s in sessions.values():
        s.close()


def run_fleet(
    specs: list[HostSpec], cfg: PreflightConfig, root: Path, dry_run: bool, notify: Notify, source: str, lock: str = ""
) -> FleetFacts:
    """Bootstrap every host (each checked against ``lock``, a lock file's text, when given), then links and
    all-reduce across those that ran; clean up on every way out."""
    stop, sessions = threading.Event(), dict[str, Session]()
    pool = ThreadPoolExecutor(max_workers=max(1, min(cfg.hosts.parallel, len(specs))))
    try:
        futures = {pool.submit(bootstrap_host, s, cfg, root, dry_run, sessions, stop, lock): s for s in specs}
        results = _gather(futures)
        for outcome, _ in results:
            done = f"{install_note(outcome.installed)}; " if outcome.installed else ""
            notify(f"{outcome.name}: {outcome.reason or f'{done}bootstrap done in {outcome.seconds:.0f} s'}")
        ran = [(sessions[o.name], p) for o, p in results if o.status == "ok" and p is not None]
        links, links_skipped = measure_links(ran, cfg.network, notify)
        reports = {o.name: o.report for o, _ in results if o.report}
        allreduce, allreduce_skipped = measure_allreduce(ran, reports, links, cfg.network, notify)
        return FleetFacts(
            tuple(o for o, _ in results), tuple(links), links_skipped, tuple(allreduce), allreduce_skipped, source
        )
    except KeyboardInterrupt:
        stop.set()
        raise
    except Stopped:
        raise KeyboardInterrupt from None
    finally:
        stop.set()
        _cleanup(sessions)
        pool.shutdown(wait=False, cancel_futures=True)
