"""Between the hosts of a fleet run: TCP both ways for every pair, round-trip times, and an all-reduce.

Links: every host runs one agent (``python -m checks.probe.tcp serve``, with an iperf3 server when iperf3 is
there); for a pair (a, b) the client on b measures b -> a and, reversed, a -> b, so each direction is measured
at its receiver. Pairs are scheduled round-robin (the circle method): n-1 rounds in which no host is in two
pairs, measured concurrently unless ``network.concurrent_pairs`` is off.

All-reduce: ``python -m torch.distributed.run`` (torchrun) on every host with a static rendezvous at the first
host, running ``checks/probe/scripts/allreduce.py``: NCCL with one process per GPU where every host has GPUs and a
CUDA torch with NCCL, else gloo with one process per host.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from functools import partial
from typing import Any

from checks.config import NetworkConfig
from checks.facts import AllreduceFacts, LinkFacts
from checks.probe.tcp import pair_rounds
from checks.reports.bootstrap import BootstrapMeasurements, Inventory
from checks.result import Report
from provision.flow import Ready, at_once, json_tail, module_script, run_module, stop_all
from provision.remote import Completed, RemoteError

Notify = Callable[[str], None]
AGENT = "checks.probe.tcp"  # the link agent, run from each host's checkout


def _client(host: Ready, args: list[str], timeout: float) -> dict[str, Any]:
    try:
        return run_module(host, AGENT, args, timeout)
    except RemoteError as exc:
        return {"error": str(exc)}


def _start_server(host: Ready, cfg: NetworkConfig) -> dict[str, Any]:
    idle = str(cfg.link_seconds * 4 + cfg.link_omit_s * 4 + 120)
    iperf3 = cfg.iperf3_port if cfg.use_iperf3 and host.prepared.iperf3 else 0
    args = ["serve", "--idle", idle, "--iperf3-port", str(iperf3)]
    try:
        return dict(json.loads(host.session.start(module_script(host.prepared, AGENT, args), 60)))
    except (RemoteError, ValueError) as exc:
        return {"error": f"the link agent did not start: {exc}"}


def _direction(client: Ready, server: dict[str, Any], addr: str, cfg: NetworkConfig, reverse: bool) -> dict[str, Any]:
    timing = ["--streams", str(cfg.link_streams), "--seconds", str(cfg.link_seconds), "--omit", str(cfg.link_omit_s)]
    timing += ["--reverse"] if reverse else []
    timeout = cfg.link_seconds + cfg.link_omit_s + 90
    if server.get("iperf3_port") and client.prepared.iperf3:
        found = _client(client, ["iperf3", addr, str(server["iperf3_port"]), *timing], timeout)
        if "error" not in found:
            return found
    return _client(client, ["client", addr, str(server["port"]), *timing], timeout)


def measure_pair(a: Ready, b: Ready, server: dict[str, Any], cfg: NetworkConfig) -> list[LinkFacts]:
    """b -> a and a -> b, measured from b against a's agent; the RTT is shared by both directions."""
    name_a, name_b, addr = a.spec.name, b.spec.name, a.session.peer_address()
    if "error" in server:
        return [LinkFacts(s, d, error=server["error"]) for s, d in ((name_b, name_a), (name_a, name_b))]
    ping = _client(b, ["rtt", addr, str(server["port"]), "--count", str(cfg.rtt_pings)], 60)
    links = []
    for src, dst, reverse in ((name_b, name_a, False), (name_a, name_b, True)):
        found = _direction(b, server, addr, cfg, reverse)
        links.append(
            LinkFacts(
                src,
                dst,
                found.get("mbit_s"),
                ping.get("rtt_ms"),
                found.get("tool", "builtin"),
                int(found.get("streams", cfg.link_streams)),
                found.get("seconds"),
                found.get("error") or ping.get("error"),
            )
        )
    return links


def measure_links(hosts: list[Ready], cfg: NetworkConfig, notify: Notify) -> tuple[list[LinkFacts], str | None]:
    """Every ordered pair of hosts: TCP throughput at the receiver and RTT; agents stopped afterwards."""
    if not cfg.links:
        return [], "disabled (preflight.network.links: false)"
    if len(hosts) < 2:
        return [], "needs two or more hosts that ran bootstrap"
    started = at_once([partial(_start_server, h, cfg) for h in hosts])
    servers = [s if s is not None else {"error": "the link agent did not start"} for s in started]
    links: list[LinkFacts] = []
    try:
        for number, pairs in enumerate(pair_rounds(len(hosts)), 1):
            jobs = [partial(measure_pair, hosts[a], hosts[b], servers[a], cfg) for a, b in pairs]
            found = at_once(jobs) if cfg.concurrent_pairs else [job() for job in jobs]
            links += [link for pair in found for link in pair or ()]
            notify(f"links: round {number} of {len(hosts) - 1 + len(hosts) % 2} measured")
    finally:
        stop_all(hosts)
    return links, None


def _inventory(report: Report | None, host: str) -> Inventory | None:
    """The host's inventory, read by the typed reader (its report was read whole where it was fetched)."""
    if report is None:
        return None
    return BootstrapMeasurements.from_json(report.measurements, f"{host}'s report.measurements").inventory


def plan_allreduce(hosts: list[Ready], reports: dict[str, Report]) -> tuple[str, list[int]] | str:
    """(backend, processes per host), or why the all-reduce cannot run."""
    inventories: list[Inventory] = []
    for host in hosts:
        inv = _inventory(reports.get(host.spec.name), host.spec.name)
        if inv is None or not inv.torch:
            return f"torch is not importable on {host.spec.name}"
        inventories.append(inv)
    if all(inv.cuda and inv.gpus and inv.nccl for inv in inventories):
        return "nccl", [min(inv.gpus, h.spec.slots or inv.gpus) for h, inv in zip(hosts, inventories, strict=True)]
    return "gloo", [1] * len(hosts)


def _launch(host: Ready, rank: int, plan: tuple[str, list[int]], master: tuple[str, int], cfg: NetworkConfig) -> str:
    prepared, (backend, counts) = host.prepared, plan
    script, tmp = shlex.quote(f"{prepared.directory}/checks/probe/scripts/allreduce.py"), shlex.quote(prepared.tmp)
    return (
        f"cd {tmp} && exec env -u SLURM_JOB_NODELIST TMPDIR={tmp} {prepared.python} -m torch.distributed.run "
        f"--nnodes={len(counts)} --node-rank={rank} --nproc-per-node={counts[rank]} --master-addr={shlex.quote(master[0])} "
        f"--master-port={master[1]} --max-restarts=0 {script} --backend {backend} --max-mib {cfg.allreduce_max_mib} "
        f"--budget-s {cfg.allreduce_budget_s} --timeout-s {cfg.allreduce_timeout_s}"
    )


def measure_allreduce(
    hosts: list[Ready], reports: dict[str, Report], links: list[LinkFacts], cfg: NetworkConfig, notify: Notify
) -> tuple[list[AllreduceFacts], str | None]:
    """All-reduce sweep across the hosts; ([], reason) when it was skipped or failed."""
    if not cfg.allreduce:
        return [], "skipped: disabled (preflight.network.allreduce: false)"
    if len(hosts) < 2:
        return [], "skipped: needs two or more hosts that ran bootstrap"
    plan = plan_allreduce(hosts, reports)
    if isinstance(plan, str):
        return [], f"skipped: {plan}"
    port = _client(hosts[0], ["free-port"], 60).get("port")
    if not port:
        return [], "failed: no free port for the rendezvous on the first host"
    master = (hosts[0].session.peer_address(), int(port))
    notify(f"all-reduce: {plan[0]}, {sum(plan[1])} processes on {len(hosts)} hosts")
    jobs = [partial(_run_rank, h, _launch(h, i, plan, master, cfg), cfg) for i, h in enumerate(hosts)]
    done = at_once(jobs)
    return _read_sweep(done, hosts)


def _run_rank(host: Ready, script: str, cfg: NetworkConfig) -> Completed | str:
    try:
        return host.session.run(script, cfg.allreduce_timeout_s + 30, track=True)
    except RemoteError as exc:
        return str(exc)


def _read_sweep(done: list[Completed | str | None], hosts: list[Ready]) -> tuple[list[AllreduceFacts], str | None]:
    for result, host in zip(done, hosts, strict=True):
        if not isinstance(result, Completed) or result.code != 0:
            why = json_tail(result).get("error") if isinstance(result, Completed) else result
            return [], f"failed on {host.spec.name}: {why}"
    data = json_tail(done[0]) if isinstance(done[0], Completed) else {}
    if "error" in data or not data.get("rows"):
        return [], f"failed: {data.get('error', 'no result from the first host')}"
    return [AllreduceFacts(**row) for row in data["rows"]], None
