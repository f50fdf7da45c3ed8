"""The one way work reaches another host, for ``bootstrap --hosts`` (``provision.fanout``), the links and the
all-reduce between hosts (``provision.remote_net``) and ``verify --hosts`` (``checks.verify.hosts``).

Per host: connect (fabric, the user's SSH config) -> check Python (3.10+) and claim the checkout directory ->
ship the checkout (rsync, else tar) -> with ``hosts.install``, a virtualenv with the dependencies (``Ready``) ->
run ``python -m MODULE`` from the checkout and read its last line as JSON (``run_module``). ``Hosts`` holds the
run's stop event and sessions: every remote wait polls the event (Ctrl-C), and on every way out what the run
started on a host is stopped and its temporary directories removed. ``in_parallel`` readies hosts side by side
while Ctrl-C still reaches the main thread at once.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from checks.config import PreflightConfig
from provision.hosts import HostSpec
from provision.remote import Completed, Prepared, RemoteError, Session, connect, remote_path
from provision.ship import prepare_script, ship
from provision.venv import ensure_venv, requirements

T = TypeVar("T")
JOIN_S = 15.0  # how long stopping or cleaning up one host may hold up the way out
INTERRUPT_GRACE_S = 5.0  # after Ctrl-C, how long readying threads get to reach their next stop point
TAIL_CHARS = 300  # of a failed module's last stderr line, in its {"error": ...}


@dataclasses.dataclass(frozen=True)
class Ready:
    """A host readied for work: its session and checkout, how the checkout got there, what ``--install`` did."""

    session: Session
    prepared: Prepared
    shipped: str  # "rsync" or "tar"
    installed: str | None = None  # Installed.summary with --install

    @property
    def spec(self) -> HostSpec:
        return self.session.spec


def python_text(spec: HostSpec, cfg: PreflightConfig) -> str:
    """The host's Python as shell text: ``python=`` from a hosts file, else ``hosts.python``."""
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


def module_script(prepared: Prepared, module: str, args: Sequence[str]) -> str:
    """The shell line that runs ``python -m MODULE ARGS`` from the host's checkout with the host's Python (a
    SLURM node list of the controller's job is not passed on: the tool there would take it for its own)."""
    return (
        f"cd {shlex.quote(prepared.directory)} && exec env -u SLURM_JOB_NODELIST {prepared.python} -m {module} "
        f"{shlex.join(args)}"
    ).rstrip()


def json_tail(done: Completed) -> dict[str, Any]:
    """A module's answer: its last stdout line as JSON, else ``{"error": "exit N: <last stderr line>"}``."""
    lines = done.out.strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        tail = (done.err.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.code}: {tail[:TAIL_CHARS]}"}


def run_module(
    host: Ready, module: str, args: Sequence[str], timeout: float, stdin: bytes | None = None, stoppable: bool = True
) -> dict[str, Any]:
    """Run ``python -m MODULE ARGS`` on the host (tracked: Ctrl-C stops it); its answer (``json_tail``)."""
    script = module_script(host.prepared, module, args)
    return json_tail(host.session.run(script, timeout, stdin=stdin, track=True, stoppable=stoppable))


def at_once(jobs: Sequence[Callable[[], T]], join_s: float | None = None) -> list[T | None]:
    """Run ``jobs`` in threads of their own and wait for each (at most ``join_s``); their results in order,
    None for one that did not finish in time."""
    results: list[T | None] = [None] * len(jobs)

    def run(i: int) -> None:
        results[i] = jobs[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return results


def in_parallel(jobs: Sequence[Callable[[], T]], workers: int, stop: threading.Event) -> list[Future[T]]:
    """Run ``jobs`` on ``workers`` threads and return their finished futures in order, waiting in short steps
    so that Ctrl-C reaches the main thread at once: it sets ``stop``, gives the jobs a moment to reach a stop
    point, and is raised again."""
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs))))
    futures = [pool.submit(job) for job in jobs]
    try:
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
    except KeyboardInterrupt:
        stop.set()
        wait(futures, timeout=INTERRUPT_GRACE_S)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return futures


class Hosts:
    """One run's hosts: the stop event every remote wait polls, and the sessions to clean up on the way out."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def ready(self, spec: HostSpec, cfg: PreflightConfig, root: Path) -> Ready:
        """Connect, claim the checkout directory, ship the checkout (and install with ``hosts.install``)."""
        session = connect(spec, cfg.hosts, self.stop)
        with self._lock:
            self.sessions[spec.name] = session
        prepared = prepare(session, cfg)
        shipped = ship(
            session, root, prepared.directory, prepared.rsync, (cfg.hosts.connect_timeout_s, cfg.hosts.dead_after_s)
        )
        if not cfg.hosts.install:
            return Ready(session, prepared, shipped)
        venv = ensure_venv(session, prepared.directory, prepared.python, requirements(root), cfg.hosts.wheelhouse)
        return Ready(session, dataclasses.replace(prepared, python=shlex.quote(venv.python)), shipped, venv.summary)

    def close(self) -> None:
        """Stop what this run started on every host, remove its temporary directories, close the connections."""
        self.stop.set()
        with self._lock:
            live = list(self.sessions.values())
        at_once([s.cleanup for s in live], JOIN_S)
        for s in live:
            s.close()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def stop_all(hosts: Sequence[Ready]) -> None:
    """SIGTERM every process this run started on ``hosts`` (their own cleanup runs), side by side."""
    at_once([h.session.kill for h in hosts], JOIN_S)
