"""``invoke verify --hosts h1,h2 [-- torchrun ...]``: one multi-node torchrun job across hosts, over the SSH fan-out
of ``bootstrap --hosts``, judged as ``verify -- COMMAND`` judges a command on one box.

Every host is connected, its Python checked and the checkout shipped by the host flow bootstrap uses too
(``provision.flow``, ``--install`` included), then probed (``checks.verify.user.node probe``: GPUs, cores, and on
the first host a free port). The ranks are planned here: NCCL with one rank per GPU where every host has GPUs and
NCCL (``slots=N`` caps a host), else gloo with one rank per host (``slots=N``: N); rank 0 is on the first host,
whose address (as SSH reached it, or ``addr=`` from a hosts file) and free port are torchrun's static rendezvous
(``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``, ``--nproc-per-node`` per host).

What runs is the tool's script ``templates/train.py`` (its flags from verify's, as ``invoke verify`` on one box
builds them: ``checks/verify/builtin.py``), or the user's own torchrun command after ``--`` with torchrun's node
flags rewritten per host (``--standalone`` and ``--rdzv-*`` dropped; anything but torchrun or ``python -m
torch.distributed.run`` is refused, exit 2). Each host runs its part under the agent (``checks.verify.user.node
run``); the program is given its exact step count (warm-up + steps) and ends by itself, every node together. The
nodes' runs are merged into one ``CommandRun`` (torchrun sets ``RANK``: the ranks are global) and judged by the
command path (``checks.verify.user.run.evaluate``): every rank's figures are in one report. The re-runs a one-box
command gets (loader and model advice, the exchange A/B, the resume replay, --sweep) are not run across hosts.

A host that cannot be reached or readied is one line and exit 2 before anything runs. A host whose ranks fail
stops the others (SIGTERM to their node, which stops its ranks); the report names the host and the rank. A failure
that only says a peer went away (``LOST_PEER``) is a symptom: the other hosts get ``PEER_GRACE_S`` to report the
cause before they are stopped, and a host stopped here is never named as the cause. Ctrl-C stops every host's
ranks and judges the partial run (exit 130).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.reports.verify import Files
from checks.result import Result, Status, ok, skip
from checks.verify import plan as v
from checks.verify import torchrun
from checks.verify.events import StepLine, parse_all
from checks.verify.report import Setting
from checks.verify.sampler import Trace
from checks.verify.user.launch import INT_GRACE_S, TERM_GRACE_S, CommandRun, StopRule, own_stderr
from provision.hosts import HostSpec

Say = Callable[[str], None]
LOST_PEER = ("connection closed", "connection reset", "broken pipe", "peer", "timed out")
# A rank that raised closes its process group before its host's launcher has seen it exit and written why; a rank
# on another host that only lost its peer can be reported first (seen on the 2-core box under load: the cause
# on h2 was stopped and came back as "killed"). Tool-defined: a rank's exit and its host's report take a few
# seconds at most; a host that is hung, not failing, is stopped this much later.
PEER_GRACE_S = 10.0
NODE = "checks.verify.user.node"
RERUNS = "loader/model advice, the exchange A/B, the resume replay and --sweep re-run one box's command: not run across hosts"  # fmt: skip


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


def torchrun_parts(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The user's torchrun command as (torchrun's flags without the node ones, the program and its arguments);
    exit 2 for a command that is not torchrun or ``python -m torch.distributed.run``."""
    parts = torchrun.parse(argv)
    if parts == torchrun.NOT_TORCHRUN or (isinstance(parts, torchrun.Torchrun) and parts.prefix):
        raise PreflightError(
            f"verify --hosts: {shlex.join(argv) or 'no command'}: across hosts verify runs a torchrun command "
            "(torchrun or python -m torch.distributed.run), its node flags set for each host",
            hint="invoke verify --hosts h1,h2 -- torchrun train.py ARGS (or leave -- out: the tool's own script)",
        )
    if isinstance(parts, str):
        raise PreflightError(f"verify --hosts: {shlex.join(argv)}: no training script after torchrun's flags")
    return list(parts.flags), list(parts.program)


def node_flags(addr: str, port: int, index: int, nodes: int, local: int) -> list[str]:
    """torchrun's static rendezvous for one host: rank 0's host at ``addr:port``."""
    return [
        f"--nnodes={nodes}",
        f"--node-rank={index}",
        f"--master-addr={addr}",
        f"--master-port={port}",
        f"--nproc-per-node={local}",
    ]


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
    """Run ``python -m checks.verify.user.node ARGS`` in the host's checkout; its last line as JSON."""
    from provision.flow import run_module

    return run_module(ready, NODE, args, timeout, stdin=stdin, stoppable=False)


def _run_node(host: Host, payload: bytes, timeout: float) -> dict[str, Any]:
    tmp = shlex.quote(host.prepared.tmp)
    host.session.run(f"mkdir -p {tmp}/ckpt && cat > {tmp}/spec.json", 30, stdin=payload, stoppable=False)
    return _node(host.ready, ["run", f"{host.prepared.tmp}/spec.json"], timeout)


def _failed(got: dict[str, Any]) -> bool:
    return "error" in got or got.get("ended") not in ("exited", "stopped")


def run_nodes(
    hosts: list[Host], payloads: list[bytes], timeout: float, say: Say
) -> tuple[list[dict[str, Any]], list[int], bool, set[int]]:
    """Run every host's ranks; when one host fails, stop the others; Ctrl-C stops all of them.

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
                say("verify: interrupted: stopping every host's ranks")
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


@dataclasses.dataclass(frozen=True)
class Culprit:
    """The host whose ranks failed first for their own reason, and the rank torchrun named (None: not named)."""

    host: str
    rank: int | None
    why: str


def merge_named(
    names: Sequence[str],
    runs: list[dict[str, Any]],
    order: list[int],
    interrupted: bool,
    stopped: set[int],
    argv: Sequence[str],
) -> tuple[CommandRun, Culprit | None]:
    """One ``CommandRun`` of every node's run (events concatenated, each tagged with its node's name; the ranks
    are global), and the culprit of a failure: the first node to fail for its own reason (a rank that only lost
    its peer on another node comes after, and a node stopped here is never the cause). ``checks/verify/job.py``
    merges a Slurm job's nodes with it too."""
    run = CommandRun(argv=tuple(argv), interrupted=interrupted)
    for name, got in zip(names, runs, strict=True):
        run.events += [dataclasses.replace(e, host=name) for e in parse_all(got.get("events"))]
        run.signals += list(got.get("signals") or [])
        run.pids |= set(got.get("pids") or [])
        run.left += [int(p) for p in got.get("left") or []]  # process ids on their host: ``left_on`` names it
    run.seconds = max(float(got.get("seconds") or 0.0) for got in runs)
    run.stopped_by_verify = interrupted or bool(stopped)
    failing = [i for i in order if _failed(runs[i])]
    own = [i for i in failing if i not in stopped and not _lost_peer(runs[i])]
    first = next(iter(own or failing), None)
    lead = runs[first] if first is not None and not interrupted else runs[0]
    run.returncode = lead.get("returncode")
    run.stderr_tail = list(lead.get("stderr_tail") or []) or ([str(lead["error"])] if lead.get("error") else [])
    if interrupted:
        run.ended = "interrupted"
    elif first is not None:
        ended = lead.get("ended")
        run.ended = ended if ended not in (None, "exited", "stopped", "interrupted") else "crashed"
        run.returncode = 1 if run.returncode in (None, 0) else run.returncode
    elif any(got.get("ended") == "stopped" for got in runs):  # a user's command, stopped after its steps
        run.ended, run.stop_reason = "stopped", "steps"
    else:
        run.ended = "exited"
    if first is None or interrupted:
        return run, None
    return run, Culprit(names[first], _rank(lead), _why(lead))


def _rank(got: dict[str, Any]) -> int | None:
    """The failed rank as torchrun's failure report names it (``rank : 1 (local_rank: 0)`` under ``Root Cause``)."""
    text = "\n".join(got.get("stderr_tail") or [])
    found = re.findall(
        r"^\s*rank\s*:\s*(\d+)", text[text.rfind("Root Cause") :] if "Root Cause" in text else text, re.M
    )
    return int(found[0]) if found else None


def _why(got: dict[str, Any]) -> str:
    """A host's failure in one line: its error, else the last line of its ranks' own traceback."""
    if got.get("error"):
        return str(got["error"])
    tail = [line for line in own_stderr(list(got.get("stderr_tail") or [])) if line.strip()]
    return tail[-1].strip() if tail else str(got.get("ended") or "")


def _lost_peer(got: dict[str, Any]) -> bool:
    """The host's ranks failed only because a rank elsewhere went away (gloo's or NCCL's words for it)."""
    return any(w in _why(got).lower() for w in LOST_PEER)


def _where(hosts: list[Host], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return where_named([h.spec.name for h in hosts], [h.session.peer_address() for h in hosts], runs)


def where_named(
    names: Sequence[str], addresses: Sequence[str | None], runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``measurements.ddp.hosts``: each node's name, address and the ranks that stepped there."""
    out = []
    for name, address, got in zip(names, addresses, runs, strict=True):
        ranks = sorted({e.rank for e in parse_all(got.get("events")) if isinstance(e, StepLine) and e.rank is not None})
        out.append({"host": name, "address": address, "ranks": ranks})
    return out


def _script(
    request: Any, options: v.Options, stack: ExitStack, backend: str, steps: int, warmup: int
) -> tuple[Any, list[str]]:
    """The tool's script for every host: ``builtin.prepare``'s flags with the device and batch of the planned
    backend and the exact step count (every node ends by itself, together); ``--ckpt-dir`` is each host's own
    temporary one unless one was asked for (then the same path on every host). Returns the ``Builtin`` and the
    script's flags."""
    from checks.probe import LocalProbe
    from checks.verify.builtin import TEMPLATE, prepare

    cfg = request.config
    b, _ = prepare(dataclasses.replace(options, nproc=1), cfg, LocalProbe(cfg.probe.torch_timeout_s).machine, stack, warmup)  # fmt: skip
    flags = list(b.command[b.command.index(str(TEMPLATE)) + 1 :])
    eff = v.effective(cfg.verify, options)
    gpu = backend == "nccl"
    batch = options.batch_size or (eff.batch_size_gpu if gpu else eff.batch_size_cpu)
    wanted = {"--device": "cuda" if gpu else "cpu", "--batch-size": str(batch), "--steps": str(warmup + steps)}
    if not (options.ckpt_dir or eff.checkpoint_dir):
        wanted["--ckpt-dir"] = "{tmp}/ckpt"  # each host's own
    wanted["--keep-batches"] = "{tmp}/keep"  # for a resume replay, which --hosts does not run: each host's own
    for i, flag in enumerate(flags[:-1]):
        if flag in wanted:
            flags[i + 1] = wanted[flag]
    return b, flags


def verify_hosts(request: Any, options: v.Options, hosts: list[HostSpec], source: str, root: Path, say: Say) -> Any:
    """Plan here, ready every host, run one torchrun job across them, judge it as a command on one box is judged.
    ``request``: ``checks.verify.user.run.CommandRequest`` (its ``command``: the user's torchrun command, or empty
    for the tool's script)."""
    from checks.verify.builtin import TEMPLATE
    from checks.verify.user.run import Gathered, evaluate

    cfg = request.config
    if options.sweep or options.ab or request.sweep or request.ab:
        raise PreflightError("verify: --sweep and --ab re-run one box's command; run them without --hosts")
    if request.seconds:
        raise PreflightError("verify --hosts: every node runs an exact number of steps", hint="use --steps N")
    if len(hosts) < 2:
        raise PreflightError("verify --hosts needs two or more hosts", hint="for one box: invoke verify --nproc N")
    started = time.monotonic()
    user, kept, program, budget, warmup, steps = asked(request, options, cfg)
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify)
    cwd = request.cwd or os.getcwd()
    from provision.flow import Hosts  # fabric and paramiko load only for --hosts

    with ExitStack() as stack:
        connected = stack.enter_context(Hosts())
        say(f"verify: readying {len(hosts)} hosts from {source} (ship the checkout, probe torch)")
        readied = _ready_all(hosts, cfg, root, connected)
        device = v.effective(cfg.verify, options).device if not user else "auto"
        backend, counts = layout(readied, device)
        world, n = sum(counts), len(readied)
        env: dict[str, str] = {}
        if user:
            b, shown = None, user
        else:
            b, flags = _script(request, options, stack, backend, steps, warmup)
            env = {k: str(b.alloc.variables[k]) for k in b.alloc_given}
            program = ["templates/train.py", *flags]
            prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
            same = [f"--nproc-per-node={counts[0]}"] if len(set(counts)) == 1 else []
            launcher = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={n}", *same]
            shown = (*prefix, *launcher, str(TEMPLATE), *[f.replace("{tmp}", "$TMP") for f in flags])
            b = dataclasses.replace(b, command=shown, processes=world)
        addr, port = readied[0].session.peer_address(), int(readied[0].probe["port"])
        say(f"verify: {world} ranks ({backend}) on {n} hosts under torchrun, rendezvous {addr}:{port}")
        payloads = []
        for i, (h, local) in enumerate(zip(readied, counts, strict=True)):
            spec = {
                "launch": [*node_flags(addr, port, i, n, local), *kept],
                "program": [a.replace("{tmp}", h.prepared.tmp) for a in program],
                "cwd": cwd if user else h.prepared.directory,
                "env": env,
                "master_addr": addr,
                "warmup": warmup,
                "steps": steps if user else 0,  # a user's command is stopped after them; the tool's script ends itself
                "first_step_s": cfg.verify.timeout_s,
                "stall_s": cfg.verify.stall_timeout_s,
            }
            payloads.append(json.dumps(spec).encode())
        runs, order, interrupted, stopped = run_nodes(
            readied, payloads, cfg.verify.timeout_s + INT_GRACE_S + TERM_GRACE_S + 60, say
        )
        run, culprit = merge_named([r.spec.name for r in readied], runs, order, interrupted, stopped, shown)
        cores = float(readied[0].probe.get("cores") or 1.0)
        price = request.price_per_hour or cfg.verify.price_per_hour
        setting = Setting(cores, Files(json_path, str(csv), str(png)), price, own_code=True)
        rule = StopRule(warmup, steps, 0.0, cfg.verify.timeout_s, cfg.verify.stall_timeout_s)
        host = readied[0].spec.name
        where = _where(readied, runs)
        gathered = Gathered(
            run, Trace(), None, None, rule, setting, None, host, started, budget, cwd, reruns=False, hosts=tuple(where)
        )
        judged = evaluate(dataclasses.replace(request, command=shown, builtin=b), gathered, say)
    head = hosts_result(readied, counts, backend, source)
    return assemble(judged, head, culprit, left_on(readied, runs), host, b is not None)


def assemble(judged: Any, head: Result, culprit: Culprit | None, left: str, host: str, own: bool) -> Any:
    """The judged run across nodes as its report says it: ``head`` first, ``verify-command`` naming the culprit
    and the processes left, the tool's script's checkpoint row (``own``). ``ddp.hosts`` and the link's figure are
    the judge's (``Gathered.hosts``)."""
    results = [_named(r, culprit, left) for r in judged.report.results]
    results = [_checkpoint_row(r, host) if r.id == "verify-checkpoint" and own else r for r in results]
    report = dataclasses.replace(judged.report, results=(head, *results))
    return dataclasses.replace(judged, report=report)


def left_on(hosts: list[Host], runs: list[dict[str, Any]]) -> str:
    """Where processes were left running: "h2: 123 456" per host ("" when none was)."""
    return left_named([h.spec.name for h in hosts], runs)


def left_named(names: Sequence[str], runs: list[dict[str, Any]]) -> str:
    """``left_on`` by the nodes' names."""
    left = [(name, got.get("left") or []) for name, got in zip(names, runs, strict=True)]
    return "; ".join(f"{name}: {' '.join(map(str, pids))}" for name, pids in left if pids)


def _named(r: Result, culprit: Culprit | None, left: str) -> Result:
    """``verify-command`` names the host (and the rank torchrun named) whose ranks failed, and the hosts of the
    processes left running."""
    if r.id != "verify-command" or (culprit is None and not left):
        return r
    if left:
        return dataclasses.replace(r, summary=f"{r.summary} (on {left})", hint=f"{r.hint} on their hosts ({left})")
    assert culprit is not None
    who = f"rank {culprit.rank} on {culprit.host}" if culprit.rank is not None else f"on {culprit.host}"
    return dataclasses.replace(r, summary=f"{r.summary} ({who})")


def _checkpoint_row(r: Result, host: str) -> Result:
    """``verify-checkpoint`` of the tool's script across hosts: rank 0 saved on its host; the file is not read or
    resumed from here (the replay re-runs one box's script)."""
    if r.status is not Status.SKIP:
        return r
    return skip("verify-checkpoint", f"rank 0 saved its checkpoint on {host}: the resume replay runs on one box only")


def hosts_result(hosts: list[Host], counts: list[int], backend: str, source: str) -> Result:
    """``verify-hosts``: which host ran which ranks, how the checkout got there, and what is not run across hosts."""
    shipped = hosts[0].ready.shipped
    parts = ranks_text([h.spec.name for h in hosts], counts)
    summary = f"{len(hosts)} hosts from {source}, {backend}: {parts} (checkout shipped by {shipped}); {RERUNS}"
    return ok("verify-hosts", summary, value=len(hosts))


def ranks_text(names: Sequence[str], counts: Sequence[int]) -> str:
    """Which node ran which global ranks: "h1 rank 0, h2 ranks 1-2"."""
    parts, first = [], 0
    for name, n in zip(names, counts, strict=True):
        parts.append(f"{name} rank{'s' if n > 1 else ''} {first}{f'-{first + n - 1}' if n > 1 else ''}")
        first += n
    return ", ".join(parts)


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


def asked(
    request: Any, options: v.Options, cfg: PreflightConfig
) -> tuple[tuple[str, ...], list[str], list[str], float, int, int]:
    """What a run across nodes (--hosts, or srun: ``checks/verify/job.py``) is asked for, checked (exit 2): the
    user's command and its torchrun parts (none: the tool's script), the budget, the warm-up and the exact steps
    every node runs."""
    from checks.verify.run import budget_s

    user = tuple(request.command)
    kept, program = torchrun_parts(user) if user else ([], [])
    budget = budget_s(request.budget, cfg.verify)
    warmup = cfg.verify.warmup if request.warmup < 0 else request.warmup
    steps = request.steps or options.steps or cfg.verify.steps
    if steps < 1 or warmup < 1:
        raise PreflightError("verify: --steps and --warmup must be at least 1 (the first step includes start-up)")
    return user, kept, program, budget, warmup, steps
