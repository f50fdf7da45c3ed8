"""``invoke verify --hosts h1,h2``: the same DDP run across hosts, over the SSH fan-out of ``bootstrap --hosts``.

Every host is connected, its Python checked and the checkout shipped by the host flow bootstrap uses too
(``provision.flow``, ``--install`` included), then probed (``checks.verify.smoke.node probe``: GPUs, cores, and
on the first host a free port). The ranks are planned here: NCCL with one rank per GPU where every host has
GPUs and NCCL (``slots=N`` caps a host), else gloo with one rank per host (``slots=N``: N); rank 0 is on the
first host, whose address (as SSH reached it, or ``addr=`` from a hosts file) and free port are the static
rendezvous. Each host runs its own ranks (``node run``); rank 0's result, with every rank's figures, is judged
here as a one-box run is.

A host that cannot be reached or readied is one line and exit 2 before anything runs. A host whose ranks fail
stops the others (SIGTERM to their node, which stops its ranks); the report names the rank. A failure that only
says a peer went away (``LOST_PEER``) is a symptom: the other hosts get ``PEER_GRACE_S`` to report the cause
before they are stopped, and a host stopped here is never named as the cause. Ctrl-C stops every host's ranks
after their step and judges the partial run (exit 130).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.probe import LocalProbe
from checks.result import Report, Result, ok
from checks.verify import plan as v
from checks.verify.contract import ChildResult, DdpSpec
from checks.verify.sampler import Trace
from checks.verify.smoke.launch import INTERRUPT_GRACE_S, ChildRun
from provision.hosts import HostSpec

Say = Callable[[str], None]
LOST_PEER = ("connection closed", "connection reset", "broken pipe", "peer", "timed out")
# A rank that raised closes its process group before its host's launcher has seen it exit and written why; a rank
# on another host that only lost its peer can be reported first (seen on the 2-core box under load: the cause
# on h2 was stopped and came back as "killed"). Tool-defined: a rank's exit and its host's report take a few
# seconds at most; a host that is hung, not failing, is stopped this much later.
PEER_GRACE_S = 10.0


@dataclasses.dataclass
class Host:
    """A readied host (``provision.flow.Ready``: fabric loads only for --hosts) and what it brings."""

    ready: Any
    probe: dict[str, Any]

    @property
    def spec(self) -> HostSpec:
        return self.ready.spec

    @property
    def session(self) -> Any:
        return self.ready.session

    @property
    def prepared(self) -> Any:
        return self.ready.prepared


def layout(hosts: list[Host], device: str) -> tuple[str, list[int]]:
    """The backend and the ranks per host: NCCL one per GPU where all have GPUs and NCCL, else gloo."""
    gpus = [h.probe.get("gpus", 0) if h.probe.get("nccl") else 0 for h in hosts]
    if device != "cpu" and all(gpus):
        return "nccl", [min(g, h.spec.slots or g) for g, h in zip(gpus, hosts, strict=True)]
    if device == "cuda":
        missing = [h.spec.name for g, h in zip(gpus, hosts, strict=True) if not g]
        raise PreflightError(f"verify --hosts --device cuda: no CUDA GPU with NCCL on {', '.join(missing)}")
    return "gloo", [h.spec.slots or 1 for h in hosts]


def ready(spec: HostSpec, cfg: PreflightConfig, root: Path, hosts: Any, first: bool) -> Host:
    """Ready the host (``provision.flow``: connect, claim the checkout directory, ship it, --install), probe it."""
    readied = hosts.ready(spec, cfg, root)
    found = _node(readied, ["probe", *(["port"] if first else [])], 120)
    if "error" in found or not found.get("torch"):
        raise PreflightError(
            f"{spec.name}: torch is not usable there: {found.get('torch_error') or found.get('error')}"
        )
    return Host(readied, found)


def _node(ready: Any, args: list[str], timeout: float, stdin: bytes | None = None) -> dict[str, Any]:
    """Run ``python -m checks.verify.smoke.node ARGS`` in the host's checkout; its last line as JSON."""
    from provision.flow import run_module

    return run_module(ready, "checks.verify.smoke.node", args, timeout, stdin=stdin, stoppable=False)


def node_spec(spec: dict[str, Any], host: Host, block: dict[str, Any], node: dict[str, Any], cfg: Any) -> bytes:
    """Verify's child spec for one host: its ranks, its own checkpoint directory, the checkout as the user path."""
    mine = {**spec, "ddp": {**block, "threads": max(1, int(host.probe["cores"]) // node["local"])}}
    mine["checkpoint"] = {**spec["checkpoint"], "dir": f"{host.prepared.tmp}/ckpt"}
    mine |= {"user_path": host.prepared.directory, "node": node, "timeout_s": cfg.timeout_s}
    mine["stall_s"] = cfg.stall_timeout_s
    return json.dumps(mine).encode()


def _run_node(host: Host, payload: bytes, timeout: float) -> dict[str, Any]:
    tmp = shlex.quote(host.prepared.tmp)
    host.session.run(f"mkdir -p {tmp}/ckpt && cat > {tmp}/spec.json", 30, stdin=payload, stoppable=False)
    return _node(host.ready, ["run", f"{host.prepared.tmp}/spec.json"], timeout)


def _failed(got: dict[str, Any]) -> bool:
    return bool("error" in got or got.get("failure") or (got.get("result") or {}).get("error"))


def run_nodes(
    hosts: list[Host], payloads: list[bytes], timeout: float, say: Say
) -> tuple[list[dict[str, Any]], list[int], bool, set[int]]:
    """Run every host's ranks; when one host fails, stop the others; Ctrl-C stops all of them after their step.

    Returns each host's run, the order in which they ended, whether Ctrl-C cut the run short, and the hosts
    stopped here because another failed (their own failure is then the stop, not a cause)."""
    pool = ThreadPoolExecutor(max_workers=len(hosts))
    futures: dict[Future[dict[str, Any]], int] = {
        pool.submit(_run_node, h, p, timeout): i for i, (h, p) in enumerate(zip(hosts, payloads, strict=True))
    }
    order: list[int] = []
    stopped: set[int] = set()
    interrupted = stopping = False
    grace: tuple[float, int] | None = None  # (until, host): a lost peer seen, waiting for the cause to be reported
    pending = set(futures)

    def stop_pending(line: str) -> None:
        nonlocal stopping
        stopping = True
        stopped.update(futures[g] for g in pending)
        say(line)
        _stop_all([hosts[futures[g]] for g in pending])

    try:
        while pending:
            try:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = stopping = True
                say("verify: interrupted: stopping every host's ranks after their step")
                _stop_all(hosts)
                continue
            for f in done:
                order.append(futures[f])
                failed = f.exception() is not None or _failed(f.result())
                if stopping or not failed or not pending:
                    continue
                if f.exception() is None and _lost_peer(f.result()):
                    grace = grace or (time.monotonic() + PEER_GRACE_S, futures[f])
                    continue
                stop_pending(f"verify: {hosts[futures[f]].spec.name} failed: stopping the other hosts' ranks")
            if grace is not None and not stopping and pending and time.monotonic() > grace[0]:
                stop_pending(f"verify: {hosts[grace[1]].spec.name} lost its peer: stopping the other hosts' ranks")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    runs = [f.result() if not f.exception() else {"error": str(f.exception())} for f in futures]
    return runs, order, interrupted, stopped


def _stop_all(hosts: list[Host]) -> None:
    from provision.flow import stop_all

    stop_all([h.ready for h in hosts])


def combine(
    hosts: list[Host], runs: list[dict[str, Any]], order: list[int], interrupted: bool, stopped: set[int]
) -> ChildRun:
    """Rank 0's result with every host's ranks; a failure is the first host's to fail for its own reason (a
    rank that only lost its peer on another host comes after, and a host stopped here is never the cause)."""
    base = dict(runs[0].get("result") or {})
    ranks = [r for got in runs for r in ((got.get("result") or {}).get("ranks") or [])]
    failing = [i for i in order if _failed(runs[i])]
    own = [i for i in failing if i not in stopped and not _lost_peer(runs[i])]
    culprit = next(iter(own or failing), None)
    run = ChildRun(result=None, interrupted=interrupted, seconds=max((g.get("seconds") or 0.0) for g in runs))
    if culprit is not None and not interrupted:
        got = runs[culprit]
        bad = got.get("result") or {}
        run.failure, run.rank = got.get("failure") or "crashed", got.get("rank")
        run.log_tail = got.get("log_tail") or got.get("error") or ""
        where = f"on {hosts[culprit].spec.name}"
        base = {**(base or bad), "error": f"{bad.get('error') or got.get('error') or run.failure} ({where})"}
        base["error_kind"] = bad.get("error_kind") or "crash"
    if interrupted and base:
        base.update(interrupted=True, error=None, error_kind=None)
    if base:
        base["ranks"] = sorted(ranks, key=lambda r: r["rank"])
        if base.get("ddp"):
            base["ddp"] = {**base["ddp"], "hosts": _where(hosts, runs)}
        run.result = ChildResult.from_json(base)
    return run


def _why(got: dict[str, Any]) -> str:
    return str((got.get("result") or {}).get("error") or got.get("error") or "")


def _lost_peer(got: dict[str, Any]) -> bool:
    """The host's ranks failed only because a rank elsewhere went away (gloo's or NCCL's words for it)."""
    return any(w in _why(got).lower() for w in LOST_PEER)


def _where(hosts: list[Host], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for h, got in zip(hosts, runs, strict=True):
        ranks = [r["rank"] for r in ((got.get("result") or {}).get("ranks") or [])]
        out.append({"host": h.spec.name, "address": h.session.peer_address(), "ranks": ranks})
    return out


def verify_hosts(request: Any, hosts: list[HostSpec], source: str, root: Path, say: Say) -> Any:
    """Plan here, ready every host, run the ranks across them, judge rank 0's result (``checks.verify.run``)."""
    from checks.verify.report import judge
    from checks.verify.run import Judged

    cfg, opts = request.config, request.options
    if opts.sweep or opts.ab:
        raise PreflightError("verify: --sweep and --ab time one process; run them without --hosts")
    if len(hosts) < 2:
        raise PreflightError("verify --hosts needs two or more hosts", hint="for one box: invoke verify --nproc N")
    from provision.flow import Hosts  # fabric and paramiko load only for --hosts

    with ExitStack() as stack:
        p, facts = v.plan(dataclasses.replace(opts, nproc=1), cfg, LocalProbe(cfg.probe.torch_timeout_s).machine, stack)
        p = dataclasses.replace(p, spec=dataclasses.replace(p.spec, loader_probe=None))
        connected = stack.enter_context(Hosts())
        say(f"verify: readying {len(hosts)} hosts from {source} (ship the checkout, probe torch)")
        readied = _ready_all(hosts, cfg, root, connected)
        backend, counts = layout(readied, p.spec.device)
        world = sum(counts)
        block = {"world_size": world, "backend": backend, "windows": cfg.verify.ddp_windows}
        block |= {"window_steps": cfg.verify.ddp_window_steps, "solo_steps": cfg.verify.ddp_solo_steps}
        block["timeout_s"] = cfg.verify.ddp_timeout_s
        addr, port = readied[0].session.peer_address(), int(readied[0].probe["port"])
        firsts = [sum(counts[:i]) for i in range(len(counts))]
        nodes = [
            {"addr": addr, "port": port, "first": f, "local": n, "index": i, "nodes": len(readied)}
            for i, (f, n) in enumerate(zip(firsts, counts, strict=True))
        ]
        say(f"verify: {world} ranks ({backend}) on {len(readied)} hosts, rendezvous {addr}:{port}")
        payloads = [node_spec(p.spec.to_json(), h, block, n, cfg.verify) for h, n in zip(readied, nodes, strict=True)]
        runs, order, interrupted, stopped = run_nodes(
            readied, payloads, cfg.verify.timeout_s + INTERRUPT_GRACE_S + 60, say
        )
        child = combine(readied, runs, order, interrupted, stopped)
        outcome = v.Outcome(child, Trace(), None, "the sampler follows this machine only: not run with --hosts")
        v.raise_usage(outcome)
        p = dataclasses.replace(p, spec=dataclasses.replace(p.spec, ddp=DdpSpec.from_json(block)))
        results, judged, verdicts = judge(p, outcome, cfg.verify)
        measurements = judged.to_json()
        problems = v.write_outputs(p.csv_path, p.png_path, outcome.trace, "invoke verify --hosts", None, p.usable_cores)
    head = hosts_result(readied, counts, backend, source)
    report = Report(host=facts.host.hostname, machine="live", results=(head, *results), measurements=measurements)
    notes = (*problems, f"wrote {p.json_path}, {p.csv_path}, {p.png_path}")
    return Judged(report, tuple(verdicts), p.json_path, notes, interrupted, focus="diagnosis")


def hosts_result(hosts: list[Host], counts: list[int], backend: str, source: str) -> Result:
    """``verify-hosts``: which host ran which ranks, and how the checkout got there."""
    parts, first = [], 0
    for h, n in zip(hosts, counts, strict=True):
        parts.append(f"{h.spec.name} rank{'s' if n > 1 else ''} {first}{f'-{first + n - 1}' if n > 1 else ''}")
        first += n
    shipped = hosts[0].ready.shipped
    summary = f"{len(hosts)} hosts from {source}, {backend}: {', '.join(parts)} (checkout shipped by {shipped})"
    return ok("verify-hosts", summary, value=len(hosts))


def _ready_all(hosts: list[HostSpec], cfg: PreflightConfig, root: Path, connected: Any) -> list[Host]:
    """Ready every host in parallel (the first asks for the rendezvous port); any that cannot be is one line
    (exit 2) naming each and why."""
    from provision.flow import in_parallel
    from provision.remote import RemoteError, Stopped

    jobs = [partial(ready, s, cfg, root, connected, i == 0) for i, s in enumerate(hosts)]
    futures = in_parallel(jobs, cfg.hosts.parallel, connected.stop)
    problems = []
    for spec, f in zip(hosts, futures, strict=True):
        exc = f.exception()
        if isinstance(exc, Stopped):
            raise KeyboardInterrupt
        if isinstance(exc, (RemoteError, PreflightError)):
            problems.append(f"{spec.name}: {exc}" if isinstance(exc, RemoteError) else str(exc))
        elif exc is not None:
            problems.append(f"{spec.name}: {type(exc).__name__}: {exc}")
    if problems:
        raise PreflightError(
            f"verify --hosts: {'; '.join(problems)}", hint="bootstrap --hosts says more about each host"
        )
    return [f.result() for f in futures]
