"""``invoke bootstrap`` started on every node of a job by the cluster's own engine (``srun``, ``torchrun``,
SkyPilot or preset ``NODE_RANK`` variables): each node runs its own checks, the records meet in torch's
TCPStore (``checks/probe/scripts/job_gather.py``, a child: the tool's own process never imports torch), and rank 0
builds the fleet report ``--hosts`` builds, its nodes named as the scheduler names them. No SSH.

One process per node runs the checks (local rank 0); the node's other processes only take part in the exchange.
A node whose record does not come within ``hosts.job_wait_s`` is a fail row: "no result from NODE".
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.facts import AllreduceFacts, FleetFacts, HostOutcome, LinkFacts
from checks.fleet.report import FleetReport, build_fleet_report
from checks.machine import bootstrap as bootstrap_run
from checks.probe.collective import allreduce_facts
from checks.probe.launch import LaunchContext, check_rendezvous
from checks.probe.torch import SCRIPTS, ChildFailed, run_child
from checks.reports.bootstrap import BootstrapMeasurements
from checks.result import Report, Result
from checks.typedjson import ContractError, Record

if TYPE_CHECKING:
    from provision.slurm import Drain, Runner


@dataclass(frozen=True)
class JobRequest:
    """This process's part of a job-wide bootstrap."""

    config: PreflightConfig
    context: LaunchContext
    local: bootstrap_run.BootstrapRequest  # the node's own checks (run by its local rank 0)
    wait_s: float  # how long rank 0 waits for every node's record


def in_a_job(ctx: LaunchContext) -> bool:
    """Started by an engine as one of several processes: bootstrap runs as a job, not on this box alone."""
    return ctx.engine != "none" and ctx.world_size > 1


def node_count(ctx: LaunchContext) -> int:
    """The job's nodes: the engine's node list, else processes over processes per node."""
    return len(ctx.nodes) if ctx.nodes else max(1, -(-ctx.world_size // max(1, ctx.local_world_size)))


def node_name(ctx: LaunchContext, index: int) -> str:
    return ctx.nodes[index] if index < len(ctx.nodes) else f"node {index}"


@dataclass(frozen=True)
class NodeRecord(Record):
    """One node's part of the exchange (``job_gather.py`` carries it as text): its bootstrap report, or why it has
    none. ``from_json`` reads the report's measurements too (``BootstrapMeasurements``): a record whose report
    another checkout wrote is refused whole, naming the key."""

    node: str
    report: Report | None
    seconds: float
    exit: int | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> NodeRecord:
        record = super().from_json(data, where)
        if record.report is not None:
            BootstrapMeasurements.from_json(record.report.measurements, f"{where or 'NodeRecord'}.report.measurements")
        return record

    def outcome(self) -> HostOutcome:
        status = "ok" if self.report is not None else "fail"
        return HostOutcome(self.node, status, self.reason, self.report, self.seconds, self.exit)


def _record(request: JobRequest) -> NodeRecord:
    """Run this node's checks; its record for the exchange (a failure is a record too, with the reason)."""
    began = time.monotonic()
    try:
        done = bootstrap_run.bootstrap(request.local)
    except PreflightError as exc:
        return NodeRecord(request.context.node_name, None, 0.0, reason=str(exc))
    seconds = round(time.monotonic() - began, 2)
    return NodeRecord(request.context.node_name, done.report, seconds, done.report.exit_code())


def node_records(got: dict[str, Any]) -> dict[int, NodeRecord]:
    """The records the exchange brought back, by node index; a record that is not one is the job's usage error."""
    try:
        return {int(k): NodeRecord.from_json(json.loads(v), f"node {k}'s record") for k, v in got.items()}
    except (ContractError, json.JSONDecodeError) as exc:
        raise PreflightError(
            f"bootstrap in a job: a node's record cannot be read: {exc}",
            hint="run the same gpu-preflight checkout on every node of the job",
        ) from None


def job_bootstrap(request: JobRequest, notify: Callable[[str], None]) -> FleetReport | None:
    """This node's checks and the exchange; the fleet report on rank 0, None on the other ranks."""
    ctx, nodes = request.context, node_count(request.context)
    net = request.config.network
    where = f"{ctx.engine} job{' ' + ctx.job_id if ctx.job_id else ''}"
    check_rendezvous(ctx, request.config.hosts.connect_timeout_s)
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-job-") as tmp:
        path = None
        if ctx.is_node_leader:
            notify(f"{ctx.node_name}: node {ctx.node_index} of {nodes} in the {where}: running its checks")
            path = Path(tmp) / "record.json"
            path.write_text(json.dumps(_record(request).to_json()), encoding="utf-8")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        args = {
            "addr": ctx.master_addr, "port": ctx.master_port, "rank": ctx.rank, "world": ctx.world_size,
            # torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; its workers are its clients
            "host_store": ctx.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
            "prefix": f"gpu-preflight/bootstrap/{ctx.job_id or 'job'}/{restart}", "node": ctx.node_index,
            "record": str(path) if path else None, "nodes": nodes, "wait_s": request.wait_s,
            "local_rank": ctx.local_rank, "allreduce_max_mib": net.allreduce_max_mib,
            "allreduce_budget_s": net.allreduce_budget_s if net.allreduce and nodes > 1 else 0.0,
            "link_seconds": net.link_seconds if net.links and nodes > 1 else 0.0, "link_omit_s": net.link_omit_s,
            "link_streams": net.link_streams, "rtt_pings": net.rtt_pings,
        }  # fmt: skip
        if ctx.rank == 0:
            notify(f"waiting up to {request.wait_s:g} s for {nodes} node(s) at {ctx.master_addr}:{ctx.master_port}")
        try:
            rounds = nodes - 1 + nodes % 2
            limit = (
                request.wait_s + net.allreduce_timeout_s + 60 + rounds * (4 * (net.link_seconds + net.link_omit_s) + 60)
            )
            got = run_child([sys.executable, str(SCRIPTS / "job_gather.py"), json.dumps(args)], limit)
        except ChildFailed as exc:
            raise PreflightError(
                f"bootstrap in a {where}: the exchange of the nodes' results failed: {exc}",
                hint=f"rank 0 serves it at {ctx.master_addr}:{ctx.master_port} (MASTER_ADDR/MASTER_PORT): "
                "that address must be reachable from every node and the port free",
            ) from exc
    if ctx.rank != 0:
        return None
    records = node_records(got.get("records", {}))
    hosts = []
    for index in range(nodes):
        rec = records.get(index)
        if rec is None:
            name = node_name(ctx, index)
            reason = f"no result from {name} within {request.wait_s:g} s (the node never ran bootstrap, or died)"
            hosts.append(HostOutcome(name, "fail", reason, None, 0.0))
            continue
        hosts.append(rec.outcome())
    rows, why = _allreduce(got.get("allreduce"), nodes, net.allreduce)
    links, skipped = _links(got, hosts, nodes, net.links)
    facts = FleetFacts(
        hosts=tuple(hosts),
        links=links,
        links_skipped=skipped,
        allreduce=rows,
        allreduce_reason=why,
        source=where,
    )
    return build_fleet_report(facts, request.config, ctx.node_name)


def _allreduce(data: dict[str, Any] | None, nodes: int, enabled: bool) -> tuple[tuple[AllreduceFacts, ...], str | None]:
    """The sweep's rows across the job's processes, or why there are none."""
    if not enabled:
        return (), "skipped: disabled (preflight.network.allreduce: false)"
    if nodes < 2:
        return (), "skipped: one node (the all-reduce between its GPUs is bootstrap's gpu-allreduce)"
    if data is None:
        return (), "skipped: a node did not report, so the job's processes could not all join"
    facts = allreduce_facts(data)  # allreduce.py's rows, as bootstrap's own all-reduce reads them
    if facts.error:
        return (), f"failed ({data.get('backend', '?')}): {facts.error}"
    return facts.rows, None


def _links(
    got: dict[str, Any], hosts: list[HostOutcome], nodes: int, enabled: bool
) -> tuple[tuple[LinkFacts, ...], str | None]:
    """The pairwise pass's rows with the nodes by name, or why there are none."""
    if not enabled:
        return (), "disabled (preflight.network.links: false)"
    if nodes < 2:
        return (), "needs two or more nodes"
    if "links" not in got:
        return (), "a node did not report, so the nodes could not pair up"
    names = [h.name for h in hosts]
    out = []
    for row in got["links"]:
        src, dst = names[int(row.pop("src"))], names[int(row.pop("dst"))]
        out.append(LinkFacts(src, dst, **row))
    return tuple(out), None


def slurm_named(ctx: LaunchContext) -> bool:
    """A Slurm job (srun, or torchrun inside a Slurm task): the nodes carry the names Slurm knows them by."""
    return ctx.engine == "slurm" or (ctx.engine == "torchrun" and bool(ctx.nodes))


def _drains(report: FleetReport, cfg: PreflightConfig) -> list[Drain]:
    """Each failing node's drain, for its first failure."""
    from provision import slurm

    by_node: dict[str, list[Result]] = {}
    for host, result in report.results:
        if host is not None:
            by_node.setdefault(host, []).append(result)
    drains = [slurm.drain_for(node, results, cfg.slurm.reason_max_chars) for node, results in by_node.items()]
    return [d for d in drains if d is not None]


def remediation(report: FleetReport, cfg: PreflightConfig, ctx: LaunchContext) -> list[str]:
    """In a Slurm job, each failing node's drain command and the ``--exclude=`` for the next job (drained only
    with ``--drain``: ``drain_failing``). Other engines name nodes Slurm does not know: nothing."""
    from provision import slurm

    return slurm.render_remediation(_drains(report, cfg)) if slurm_named(ctx) else []


def drain_failing(
    report: FleetReport, cfg: PreflightConfig, ctx: LaunchContext, runner: Runner | None = None
) -> list[str]:
    """``--drain`` in a Slurm job: rank 0 drains each failing node, as ``--hook --drain`` drains its own; a line
    for each (a refused scontrol, such as a user who is not a Slurm operator, is said, not raised)."""
    from provision import slurm

    lines = []
    for plan in _drains(report, cfg) if slurm_named(ctx) else []:
        try:
            slurm.drain(plan, runner or slurm.run_scontrol, cfg.slurm.scontrol_timeout_s)
            lines.append(f"drained {plan.node}: {plan.reason}")
        except PreflightError as exc:
            lines.append(f"drain of {plan.node} failed: {str(exc).removeprefix('gpu-preflight: ')}")
    return lines
