"""How this process was started: torchrun, a Slurm task, SkyPilot, a preset ``MASTER_ADDR``/``NODE_RANK``, or none.

The one reader of the launch variables. ``read_launch`` is pure (a mapping and a host name in, a frozen
``LaunchContext`` out); ``launch_context`` passes the real environment. Detection order, first match wins:

1. torchrun: ``TORCHELASTIC_RUN_ID`` is set (what ``torch.distributed.is_torchelastic_launched`` tests;
   docs/sources.md#torchrun-env). Rank, local rank, sizes, node index (``GROUP_RANK``: under c10d it is torchrun's
   own numbering, not ``SLURM_NODEID``) and the rendezvous come from torchrun's variables; when torchrun runs
   inside a Slurm task, the node name, job id and node list still come from Slurm.
2. Slurm task: ``SLURM_PROCID`` is set (srun(1), docs/sources.md#slurm-srun-env). The node name is
   ``SLURMD_NODENAME``, the name the scheduler knows, not the host name. The rendezvous is the first node of the
   step and ``MASTER_PORT`` or 15000 + the last 4 digits of the job id (docs/sources.md#lightning-slurm-env).
3. SkyPilot: ``SKYPILOT_NODE_RANK`` (docs/sources.md#skypilot-env): one process per node, named by its address in
   ``SKYPILOT_NODE_IPS``, the first of which is the rendezvous.
4. env: ``NODE_RANK`` with ``MASTER_ADDR`` and ``WORLD_SIZE``, as providers preset them before any launcher runs.
   ``WORLD_SIZE`` alone proves nothing (some preset it to all GPUs of the cluster), so it never selects this.
5. none: one process on this host.

A launcher's variable that is missing or not a number is one error naming it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from checks.errors import PreflightError
from checks.hostlist import expand_nodelist

Engine = Literal["torchrun", "slurm", "skypilot", "env", "none"]
TORCHRUN_DEFAULT_PORT = 29500  # torchrun's --master-port default (docs/sources.md#torchrun-env)


class LaunchError(PreflightError):
    """The launcher's variables are missing, not numbers, or contradict each other."""


@dataclass(frozen=True)
class LaunchContext:
    """This process's place in its job, whichever engine started it."""

    engine: Engine
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_index: int
    node_name: str
    master_addr: str
    master_port: int
    job_id: str = ""
    nodes: tuple[str, ...] = ()  # the job's (or step's) nodes, expanded, in the engine's order
    master_from: str = "MASTER_ADDR"  # where master_addr came from, for an error that names it

    @property
    def is_node_leader(self) -> bool:
        """The one process per node that runs the node's checks."""
        return self.local_rank == 0


def _need(environ: Mapping[str, str], name: str, engine: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise LaunchError(f"launched by {engine}, but {name} is not set", hint=f"{engine} sets {name} for each task")
    return value


def _number(environ: Mapping[str, str], name: str, engine: str) -> int:
    value = _need(environ, name, engine)
    if not value.isdigit():
        raise LaunchError(f"launched by {engine}, but {name}={value!r} is not a whole number")
    return int(value)


def _optional_number(environ: Mapping[str, str], name: str, engine: str, default: int) -> int:
    return _number(environ, name, engine) if environ.get(name, "").strip() else default


def _slurm_nodes(environ: Mapping[str, str]) -> tuple[str, ...]:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"):
        if environ.get(name, "").strip():
            return tuple(expand_nodelist(environ[name], name))
    return ()


def _tasks_on_node(text: str, node_index: int) -> int | None:
    """Slurm's ``2(x3),1`` (tasks per node, run-length coded): the count on node ``node_index``."""
    counts: list[int] = []
    for piece in text.split(","):
        count, _, repeat = piece.partition("(x")
        if not count.isdigit() or (repeat and not repeat.rstrip(")").isdigit()):
            return None
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[node_index] if node_index < len(counts) else None


def _slurm(environ: Mapping[str, str]) -> LaunchContext:
    engine = "Slurm (srun)"
    rank, world = _number(environ, "SLURM_PROCID", engine), _number(environ, "SLURM_NTASKS", engine)
    node_index, local_rank = _number(environ, "SLURM_NODEID", engine), _number(environ, "SLURM_LOCALID", engine)
    job_id, node_name = _need(environ, "SLURM_JOB_ID", engine), _need(environ, "SLURMD_NODENAME", engine)
    nodes = _slurm_nodes(environ)
    if not nodes:
        raise LaunchError(f"launched by {engine}, but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
    local_world = _tasks_on_node(per_node, node_index) if per_node else max(1, world // len(nodes))
    digits = "".join(ch for ch in job_id if ch.isdigit())[-4:] or "0"
    port = _optional_number(environ, "MASTER_PORT", engine, 15000 + int(digits))
    addr = environ.get("MASTER_ADDR") or nodes[0]
    where = "MASTER_ADDR" if environ.get("MASTER_ADDR") else "the step's first node"
    return _checked(
        LaunchContext(
            "slurm", rank, local_rank, world, local_world or 1, node_index, node_name, addr, port, job_id, nodes, where
        )
    )


def _torchrun(environ: Mapping[str, str], hostname: str) -> LaunchContext:
    engine = "torchrun"
    numbers = {name: _number(environ, name, engine) for name in
               ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT")}  # fmt: skip
    under_slurm = bool(environ.get("SLURMD_NODENAME", "").strip())
    return _checked(
        LaunchContext(
            "torchrun",
            numbers["RANK"],
            numbers["LOCAL_RANK"],
            numbers["WORLD_SIZE"],
            numbers["LOCAL_WORLD_SIZE"],
            numbers["GROUP_RANK"],
            environ["SLURMD_NODENAME"].strip() if under_slurm else hostname,
            _need(environ, "MASTER_ADDR", engine),
            numbers["MASTER_PORT"],
            environ.get("SLURM_JOB_ID", "") if under_slurm else environ["TORCHELASTIC_RUN_ID"],
            _slurm_nodes(environ) if under_slurm else (),
        )
    )


def _skypilot(environ: Mapping[str, str]) -> LaunchContext:
    engine = "SkyPilot"
    node_index, count = _number(environ, "SKYPILOT_NODE_RANK", engine), _number(environ, "SKYPILOT_NUM_NODES", engine)
    nodes = tuple(_need(environ, "SKYPILOT_NODE_IPS", engine).split())
    if len(nodes) != count:
        raise LaunchError(f"SkyPilot: SKYPILOT_NODE_IPS lists {len(nodes)} addresses, SKYPILOT_NUM_NODES is {count}")
    port = _optional_number(environ, "MASTER_PORT", engine, TORCHRUN_DEFAULT_PORT)
    name = nodes[node_index] if node_index < count else ""
    first = "SKYPILOT_NODE_IPS' first address"
    return _checked(
        LaunchContext("skypilot", node_index, 0, count, 1, node_index, name, nodes[0], port, "", nodes, first)
    )


def _preset(environ: Mapping[str, str], hostname: str) -> LaunchContext:
    engine = "a preset NODE_RANK"
    node_index, world = _number(environ, "NODE_RANK", engine), _number(environ, "WORLD_SIZE", engine)
    addr = _need(environ, "MASTER_ADDR", engine)
    port = _optional_number(environ, "MASTER_PORT", engine, TORCHRUN_DEFAULT_PORT)
    rank = _optional_number(environ, "RANK", engine, node_index)
    local_rank = _optional_number(environ, "LOCAL_RANK", engine, 0)
    local_world = _optional_number(environ, "LOCAL_WORLD_SIZE", engine, 1)
    return _checked(LaunchContext("env", rank, local_rank, world, local_world, node_index, hostname, addr, port))


def _checked(ctx: LaunchContext) -> LaunchContext:
    """Refuse a context whose numbers cannot all be true (a rank past the world, a node past the node list)."""
    if ctx.rank >= ctx.world_size:
        raise LaunchError(f"{ctx.engine}: rank {ctx.rank} is not below the world size {ctx.world_size}")
    if ctx.local_rank >= ctx.local_world_size:
        raise LaunchError(f"{ctx.engine}: local rank {ctx.local_rank} is not below {ctx.local_world_size}")
    if ctx.nodes and ctx.engine != "torchrun" and ctx.node_index >= len(ctx.nodes):
        raise LaunchError(f"{ctx.engine}: node index {ctx.node_index} is past the {len(ctx.nodes)} nodes of the job")
    return ctx


def read_launch(environ: Mapping[str, str], hostname: str) -> LaunchContext:
    """Recognise the launcher from ``environ`` and normalise it; ``hostname`` names a node no engine names."""
    if environ.get("TORCHELASTIC_RUN_ID", "").strip():
        return _torchrun(environ, hostname)
    if environ.get("SLURM_PROCID", "").strip():
        return _slurm(environ)
    if environ.get("SKYPILOT_NODE_RANK", "").strip():
        return _skypilot(environ)
    if environ.get("NODE_RANK", "").strip():
        return _preset(environ, hostname)
    return LaunchContext("none", 0, 0, 1, 1, 0, hostname, "127.0.0.1", TORCHRUN_DEFAULT_PORT)


def launch_context() -> LaunchContext:
    """This process's launch context, from the real environment and host name."""
    return read_launch(os.environ, socket.gethostname())


def scheduler_node_name(environ: Mapping[str, str], hostname: str) -> str:
    """The name Slurm knows this node by: ``SLURMD_NODENAME`` where Slurm sets it (tasks, Prolog and Epilog,
    docs/sources.md#slurm-node-hooks), else the short host name (a HealthCheckProgram, a login shell)."""
    return environ.get("SLURMD_NODENAME", "").strip() or hostname.split(".", 1)[0]


def this_node_name() -> str:
    """``scheduler_node_name`` of the real environment and host name."""
    return scheduler_node_name(os.environ, socket.gethostname())


def unresolved(addr: str, timeout_s: float) -> str | None:
    """Why the rendezvous address ``addr`` does not resolve here (``getaddrinfo``), or None when it does. A resolver
    that does not answer within ``timeout_s`` counts as not resolving; the lookup thread is left to finish alone."""
    found: list[str | None] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
            found.append(None)
        except (OSError, UnicodeError) as exc:
            found.append(str(getattr(exc, "strerror", None) or exc))

    worker = threading.Thread(target=lookup, name=f"resolve {addr}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return found[0] if found else f"no answer from the resolver within {timeout_s:g} s"


def check_rendezvous(ctx: LaunchContext, timeout_s: float) -> None:
    """Refuse, before anything starts, a rendezvous address this node cannot resolve (exit 2, naming it): bootstrap's
    store and verify's torchrun would wait for peers that can never reach it."""
    why = unresolved(ctx.master_addr, timeout_s)
    if why is None:
        return
    raise PreflightError(
        f"{ctx.node_name}: the rendezvous address {ctx.master_addr} ({ctx.master_from}) does not resolve: {why}",
        hint="set MASTER_ADDR to an address every node resolves: the first node's NodeAddr in scontrol show node",
    )
