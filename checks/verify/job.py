"""``srun -N2 --ntasks-per-node=1 invoke verify [-- torchrun ...]`` (or SkyPilot's one process per node): one
multi-node torchrun job across the job's nodes, judged on the command path with every rank in one report. No SSH.

Each task (one per node) runs its node's part of the job itself, as ``checks.verify.user.node run`` does for
``--hosts`` (the same ``node.run``: torchrun under the agent, ``GLOO/NCCL_SOCKET_IFNAME`` toward the rendezvous
host, SIGTERM/SIGINT stop its ranks): its node rank is its task rank, the node count the job's tasks, and the
rendezvous the job's first node at ``MASTER_ADDR``/``MASTER_PORT`` (``checks.probe.launch``: the step's first node
and a port from the job id unless the user set them); an address that does not resolve stops every task at once,
naming it (``checks.probe.launch.check_rendezvous``, as bootstrap does). The node's ranks: one per GPU with NCCL (``--nproc`` caps it),
else one gloo rank (``--nproc N``: N); the job's nodes are taken to be alike (one partition).

What runs is the tool's script (``hosts._script``: ``builtin.prepare``'s flags with the exact step count, so that
every node ends by itself, together; each node's own temporary ``--ckpt-dir``) or the user's torchrun command after
``--`` with its node flags set per node (``hosts.torchrun_parts``; a command that is not torchrun is judged on each
node by itself, as one box judges it: ``torchrun_command``).

Then the nodes meet once more, through bootstrap's exchange (``checks/probe/scripts/job_gather.py``, a TCPStore
at the rendezvous address, port ``MASTER_PORT + 1``: torchrun's own store may still be up on node 0 when another
node is done): every node sends its run, node 0 merges them (``hosts.merge_named``), judges the one run without
re-runs (``user.run.evaluate``) and writes the one report; the other tasks say where the report is and exit 1
when their own ranks failed, else 0. A node whose run does not come within ``hosts.job_wait_s`` after node 0's
own ended is named ("no result from NODE"); after Ctrl-C or SIGTERM the wait is ``INTERRUPTED_WAIT_S``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from checks.errors import PreflightError
from checks.probe.launch import LaunchContext, check_rendezvous
from checks.reports.verify import Files
from checks.result import Result, ok
from checks.verify import hosts as h
from checks.verify import plan as v
from checks.verify.report import Setting
from checks.verify.sampler import Trace
from checks.verify.user.launch import INT_GRACE_S, TERM_GRACE_S, StopRule

Say = Callable[[str], None]
# After Ctrl-C or SIGTERM (scancel: Slurm sends SIGKILL KillWait later, 30 s by default) node 0 waits this long for
# the other nodes' runs, and they this long for node 0. Tool-defined.
INTERRUPTED_WAIT_S = 10.0
GATHER_PORT_OFFSET = 1  # the exchange's port past the rendezvous port (torchrun's store)


@dataclasses.dataclass(frozen=True)
class Sent:
    """A node other than node 0: its run went to node 0 (or could not); the line it says and its exit status."""

    line: str
    code: int


def in_job(ctx: LaunchContext) -> bool:
    """Started by Slurm (srun) or SkyPilot on two or more nodes: verify runs one job across them."""
    return ctx.engine in ("slurm", "skypilot") and ctx.world_size > 1


def torchrun_command(argv: Sequence[str]) -> bool:
    """``argv`` is a torchrun command (``torchrun`` or ``python -m torch.distributed.run``): run across the job."""
    try:
        h.torchrun_parts(argv)
    except PreflightError:
        return False
    return True


def local_layout(found: dict[str, Any], device: str, nproc: int, node: str) -> tuple[str, int]:
    """This node's backend and ranks: NCCL one per GPU (``nproc`` caps it) where torch has GPUs and NCCL, else gloo
    with ``nproc`` ranks (1 when 0)."""
    gpus = int(found.get("gpus") or 0) if found.get("nccl") else 0
    if device != "cpu" and gpus:
        return "nccl", min(gpus, nproc or gpus)
    if device == "cuda":
        raise PreflightError(f"verify under srun --device cuda: no CUDA GPU with NCCL on {node}")
    return "gloo", nproc or 1


def verify_job(request: Any, options: v.Options, ctx: LaunchContext, say: Say) -> Any:
    """This node's part of the job's run; on node 0 the judged run of every node (``Judged``), elsewhere ``Sent``.
    ``request``: ``checks.verify.user.run.CommandRequest`` (its ``command``: the user's torchrun command, or
    empty for the tool's script)."""
    from checks.probe.tcp import route
    from checks.verify.builtin import TEMPLATE
    from checks.verify.user import node
    from checks.verify.user.node import probe
    from checks.verify.user.run import Gathered, evaluate

    cfg = request.config
    if options.sweep or options.ab or request.sweep or request.ab:
        raise PreflightError("verify: --sweep and --ab re-run one box's command; run them outside srun")
    if request.seconds:
        raise PreflightError("verify under srun: every node runs an exact number of steps", hint="use --steps N")
    if ctx.local_world_size != 1:
        raise PreflightError(
            f"verify under {ctx.engine}: {ctx.local_world_size} tasks on this node; it runs as one task per node",
            hint="srun --ntasks-per-node=1 invoke verify: each node starts its own ranks (one per GPU)",
        )
    check_rendezvous(ctx, cfg.hosts.connect_timeout_s)
    started = time.monotonic()
    user, kept, program, budget, warmup, steps = h.asked(request, options, cfg)
    first = ctx.rank == 0
    json_path, csv, png = v.outputs(request.json, request.plot, cfg.verify) if first else ("", "", "")
    cwd = request.cwd or os.getcwd()
    index, n, me = ctx.rank, ctx.world_size, ctx.node_name
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-preflight-job-"))
        found = probe(False)
        if not found.get("torch"):
            raise PreflightError(f"{me}: torch is not usable here: {found.get('torch_error')}")
        device = v.effective(cfg.verify, options).device if not user else "auto"
        backend, local = local_layout(found, device, options.nproc, me)
        env: dict[str, str] = {}
        b = None
        if not user:
            b, flags = h._script(request, options, stack, backend, steps, warmup)
            env = {k: str(b.alloc.variables[k]) for k in b.alloc_given}
            program = [str(TEMPLATE), *(f.replace("{tmp}", tmp) for f in flags)]
        where = f"{ctx.engine} job{' ' + ctx.job_id if ctx.job_id else ''}"
        say(
            f"verify: {me}: node {index} of {n} in the {where}, {local} rank{'s' if local > 1 else ''} ({backend}) "
            f"under torchrun, rendezvous {ctx.master_addr}:{ctx.master_port} ({ctx.master_from})"
        )
        spec = {
            "launch": [*h.node_flags(ctx.master_addr, ctx.master_port, index, n, local), *kept],
            "program": program,
            "cwd": cwd,
            "env": env,
            "master_addr": ctx.master_addr,
            "warmup": warmup,
            "steps": steps if user else 0,  # a user's command is stopped after them; the tool's script ends itself
            "first_step_s": cfg.verify.timeout_s,
            "stall_s": cfg.verify.stall_timeout_s,
        }
        got = node.run(spec)
        interrupted = bool(got.get("interrupted"))
        record = {
            "node": me,
            "local": local,
            "backend": backend,
            "address": route(ctx.master_addr).get("address"),
            "ended_at": time.time(),
            "run": got,
        }
        records, problem = _exchange(ctx, record, cfg, interrupted, Path(tmp))
        if not first:
            return _sent(ctx, got, problem)
        if problem:
            say(f"verify: {problem}")
        names, runs, counts, addresses, order = _gathered(
            ctx, records, record, cfg.hosts.job_wait_s, interrupted, problem
        )
        interrupted = interrupted or any(r.get("interrupted") for r in runs)
        world = sum(counts)
        if user:
            shown: tuple[str, ...] = user
        else:
            assert b is not None
            prefix = ["env", *(f"{k}={x}" for k, x in env.items())] if env else []
            same = [f"--nproc-per-node={counts[0]}"] if len(set(counts)) == 1 else []
            launcher = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={n}", *same]
            shown = (*prefix, *launcher, *(a.replace(tmp, "$TMP") for a in program))
            b = dataclasses.replace(b, command=shown, processes=world)
        run, culprit = h.merge_named(names, runs, order, interrupted, set(), shown)
        price = request.price_per_hour or cfg.verify.price_per_hour
        setting = Setting(float(found.get("cores") or 1.0), Files(json_path, str(csv), str(png)), price, own_code=True)
        rule = StopRule(warmup, steps, 0.0, cfg.verify.timeout_s, cfg.verify.stall_timeout_s)
        spots = h.where_named(names, addresses, runs)
        gathered = Gathered(
            run, Trace(), None, None, rule, setting, None, me, started, budget, cwd, reruns=False, hosts=tuple(spots)
        )
        judged = evaluate(dataclasses.replace(request, command=shown, builtin=b), gathered, say)
    head = job_result(names, counts, backend, where)
    return h.assemble(judged, head, culprit, h.left_named(names, runs), me, b is not None)


def _exchange(
    ctx: LaunchContext, record: dict[str, Any], cfg: Any, interrupted: bool, tmp: Path
) -> tuple[dict[str, str], str]:
    """Every node's record to node 0 through bootstrap's exchange (``job_gather.py``, torch's TCPStore); node 0
    gets the records by node index. Returns them and what went wrong ("" when nothing did)."""
    from checks.probe.torch import SCRIPTS

    path = tmp / "record.json"
    path.write_text(json.dumps(record, default=str), encoding="utf-8")
    if interrupted:
        wait = INTERRUPTED_WAIT_S
    elif ctx.rank == 0:
        wait = cfg.hosts.job_wait_s  # node 0's run has ended: the others end within this or are named
    else:  # node 0 may still be running its ranks, up to their time limit
        wait = cfg.verify.timeout_s + INT_GRACE_S + TERM_GRACE_S + cfg.hosts.job_wait_s
    port = ctx.master_port + GATHER_PORT_OFFSET
    args = {
        "addr": ctx.master_addr, "port": port, "rank": ctx.rank, "world": ctx.world_size,
        "host_store": ctx.rank == 0, "prefix": f"gpu-preflight/verify/{ctx.job_id or 'job'}", "node": ctx.rank,
        "record": str(path), "nodes": ctx.world_size, "wait_s": wait, "allreduce_budget_s": 0.0, "link_seconds": 0.0,
    }  # fmt: skip
    argv = [sys.executable, str(SCRIPTS / "job_gather.py"), json.dumps(args)]
    where = f"the exchange at {ctx.master_addr}:{port}"
    try:  # run, not run_child: node 0's answer holds every node's events, more than a pipe buffer
        done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=wait + 60, check=False)
    except subprocess.TimeoutExpired:
        return {}, f"{where} gave no answer within {wait + 60:g} s"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, f"{where} failed (exit {done.returncode}): {tail}"
    if ctx.rank != 0:
        return {}, "" if out.get("sent") else f"{where}: this node's run was not sent"
    return {str(k): str(x) for k, x in (out.get("records") or {}).items()}, ""


def _gathered(
    ctx: LaunchContext,
    records: dict[str, str],
    own: dict[str, Any],
    wait_s: float,
    interrupted: bool,
    problem: str = "",
) -> tuple[list[str], list[dict[str, Any]], list[int], list[str | None], list[int]]:
    """Node 0's view of every node: names, runs, rank counts, addresses, and the order in which they ended (a node
    with no record last, its run the reason: the exchange's ``problem`` where it failed, else the wait)."""
    names: list[str] = []
    runs: list[dict[str, Any]] = []
    counts: list[int] = []
    addresses: list[str | None] = []
    ended: list[float] = []
    for i in range(ctx.world_size):
        text = records.get(str(i))
        try:
            got = own if i == 0 else json.loads(text) if text else None
        except json.JSONDecodeError:
            got = None
        name = ctx.nodes[i] if i < len(ctx.nodes) else f"node {i}"
        if not isinstance(got, dict):
            waited = INTERRUPTED_WAIT_S if interrupted else wait_s
            why = (
                f"no result from {name}: {problem}"
                if problem
                else f"no result from {name} within {waited:g} s after {ctx.node_name}'s run ended (its task died, "
                "or never ran verify)"
            )
            names.append(name)
            runs.append({"error": why, "events": []})
            counts.append(own["local"])  # the nodes are alike: its ranks are numbered as if it had run
            addresses.append(None)
            ended.append(float("inf"))
            continue
        names.append(str(got.get("node") or name))
        runs.append(dict(got.get("run") or {}))
        counts.append(int(got.get("local") or 1))
        addresses.append(got.get("address"))
        ended.append(float(got.get("ended_at") or 0.0))
    order = sorted(range(len(ended)), key=lambda i: ended[i])
    return names, runs, counts, addresses, order


def _sent(ctx: LaunchContext, got: dict[str, Any], problem: str) -> Sent:
    """A node other than node 0: what it says, and its exit status (1: its ranks failed or its run did not reach
    node 0; 130: interrupted)."""
    first = ctx.nodes[0] if ctx.nodes else "node 0"
    ended = "interrupted" if got.get("interrupted") else str(got.get("error") or got.get("ended") or "?")
    failed = "error" in got or got.get("ended") not in ("exited", "stopped")
    code = 130 if got.get("interrupted") else 1 if failed or problem else 0
    where = f"could not send it to {first}: {problem}" if problem else f"the job's report is written on {first}"
    return Sent(f"verify: {ctx.node_name}: this node's ranks ended ({ended}); {where}", code)


def job_result(names: Sequence[str], counts: Sequence[int], backend: str, where: str) -> Result:
    """``verify-hosts``: which node of the job ran which ranks, and what is not run across nodes."""
    summary = f"{len(names)} nodes of the {where}, {backend}: {h.ranks_text(names, counts)}; {h.RERUNS.replace('hosts', 'nodes')}"
    return ok("verify-hosts", summary, value=len(names))
