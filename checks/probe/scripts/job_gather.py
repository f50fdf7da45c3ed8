"""Gather one record per node of a job through torch's TCPStore (child process: imports torch).

    python job_gather.py '{"addr": A, "port": P, "rank": R, "world": W, "host_store": bool, "prefix": S,
                           "node": I, "record": PATH|null, "nodes": N, "wait_s": T}'

Each node leader (``record`` names its report file) sets ``PREFIX/node/I``; rank ``0`` hosts the store (unless
torchrun's agent does: ``host_store`` false) and waits up to ``wait_s`` for the ``N`` nodes' keys. A node whose key
never comes is left out: the parent names it ("no result from NODE"), so one dead node cannot hang the job's
report. Rank 0 prints ``{"records": {I: text}, "missing": [I...], "seconds": s, "allreduce": {...}}``; the others
``{"sent": bool}``. Rank 0 sets ``PREFIX/done`` when it has read them ("1": every node reported), and the others
wait for it (up to ``wait_s``); on "1", with ``allreduce_budget_s`` > 0, every rank then joins one process group on
the same store for ``allreduce.py``'s size sweep across the nodes.

Then, with ``link_seconds`` > 0, the links (node leaders only, as ``bootstrap --hosts`` measures them over SSH, with
the same built-in TCP test of ``checks/probe/tcp.py``): every leader serves a link agent in a thread and publishes
the address it reaches rank 0 from; node pairs go round-robin (no node in two tests at once), the higher node of
each pair measuring the round-trip time and both directions against the lower one's agent; a round ends when
every leader has counted itself in. Rank 0 adds every pair's rows to its output as ``links``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the checkout: checks.probe.tcp (standard library only)


def main(args: dict) -> dict:
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=float(args["wait_s"]))
    began = time.monotonic()
    store = dist.TCPStore(args["addr"], int(args["port"]), int(args["world"]), bool(args["host_store"]),
                          timeout=wait, wait_for_workers=False)  # fmt: skip
    prefix = str(args["prefix"])
    record = args.get("record")
    if record:
        store.set(f"{prefix}/node/{int(args['node'])}", Path(record).read_text(encoding="utf-8"))
    if int(args["rank"]) != 0:
        go = "0"
        with contextlib.suppress(Exception):  # rank 0 gave up or went away: this node's part is done either way
            store.wait([f"{prefix}/done"], wait)
            go = store.get(f"{prefix}/done").decode()
        if go == "1":
            if float(args.get("allreduce_budget_s") or 0) > 0:
                allreduce(store, args)
            if record:
                links(store, args)
        return {"sent": bool(record)}
    keys = {i: f"{prefix}/node/{i}" for i in range(int(args["nodes"]))}
    deadline = began + float(args["wait_s"])
    while time.monotonic() < deadline and not store.check(list(keys.values())):  # True once every key is set
        time.sleep(0.05)
    records = {i: store.get(k).decode("utf-8") for i, k in keys.items() if store.check([k])}
    missing = [i for i in keys if i not in records]
    store.set(f"{prefix}/done", "0" if missing else "1")  # every rank takes part in what follows, or none does
    out: dict = {"records": records, "missing": missing, "seconds": round(time.monotonic() - began, 3)}
    if not missing and float(args.get("allreduce_budget_s") or 0) > 0:
        out["allreduce"] = allreduce(store, args)
    if not missing:
        out["links"] = links(store, args)
    return out


def allreduce(store: Any, args: dict) -> dict:
    """Every rank of the job in one process group on the same store: allreduce.py's size sweep across the nodes
    (NCCL when this rank has its GPU, else gloo); rank 0's rows, or the error."""
    import torch
    import torch.distributed as dist
    from allreduce import sweep_in_group, use_route_interface  # the sibling script bootstrap --hosts runs

    use_route_interface(str(args["addr"]))
    local = int(args.get("local_rank") or 0)
    backend = "nccl" if torch.cuda.is_available() and local < torch.cuda.device_count() else "gloo"
    budget = argparse.Namespace(backend=backend, max_mib=int(args.get("allreduce_max_mib") or 256),
                                budget_s=float(args["allreduce_budget_s"]))  # fmt: skip

    def init() -> None:
        dist.init_process_group(backend, store=dist.PrefixStore(f"{args['prefix']}/pg", store), rank=int(args["rank"]),
                                world_size=int(args["world"]), timeout=datetime.timedelta(seconds=60))  # fmt: skip

    try:
        rows = sweep_in_group(torch, dist, budget, local, init)
    except Exception as exc:  # noqa: BLE001 - the records stand; the sweep's failure is reported with them
        return {
            "backend": backend,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
        }
    return {"backend": backend, "world_size": int(args["world"]), "rows": rows}


def links(store: Any, args: dict) -> list[dict]:
    """This leader's part of the pairwise link pass; rank 0 returns every pair's rows (both directions each)."""
    from checks.probe.tcp import pair_rounds, route
    from checks.probe.tcp_server import Server

    seconds, nodes = float(args.get("link_seconds") or 0), int(args["nodes"])
    if seconds <= 0 or nodes < 2:
        return []
    me, prefix, wait = int(args["node"]), f"{args['prefix']}/links", float(args["wait_s"])
    round_s = 4 * (seconds + float(args["link_omit_s"])) + 60  # a pair's two directions and RTT, with room
    server = Server("", 0, idle=wait + nodes * round_s)
    threading.Thread(target=server.serve, daemon=True).start()
    addr = route(str(args["addr"])).get("address") or str(args["addr"])
    store.set(f"{prefix}/agent/{me}", f"{addr} {server.port}")
    for number, pairs in enumerate(pair_rounds(nodes)):
        for a, b in pairs:
            if me == b:  # the higher node measures against the lower one's agent
                host, port = store.get(f"{prefix}/agent/{a}").decode().split()
                store.set(f"{prefix}/pair/{a}-{b}", json.dumps(_pair(a, b, host, int(port), args)))
        store.add(f"{prefix}/round/{number}", 1)
        deadline = time.monotonic() + wait + round_s
        while store.add(f"{prefix}/round/{number}", 0) < nodes and time.monotonic() < deadline:
            time.sleep(0.05)
    if int(args["rank"]) != 0:
        return []
    keys = [f"{prefix}/pair/{a}-{b}" for pairs in pair_rounds(nodes) for a, b in pairs]
    return [row for key in keys if store.check([key]) for row in json.loads(store.get(key).decode())]


def _pair(a: int, b: int, host: str, port: int, args: dict) -> list[dict]:
    """b -> a and a -> b, measured from b against a's agent with the link settings in ``args``; the RTT is shared
    by both directions."""
    from checks.probe.tcp import rtt, tcp_forward, tcp_reverse

    streams, seconds, omit = int(args["link_streams"]), float(args["link_seconds"]), float(args["link_omit_s"])
    try:
        ping = rtt(host, port, int(args["rtt_pings"]))
    except OSError as exc:
        ping = {"error": f"round trip to node {a} at {host}:{port}: {exc}"}
    rows = []
    for src, dst, run in ((b, a, tcp_forward), (a, b, tcp_reverse)):
        try:
            found = run(host, port, streams, seconds, omit)
        except OSError as exc:
            found = {"error": f"TCP to node {a} at {host}:{port}: {exc}"}
        rows.append({"src": src, "dst": dst, "tcp_mbit_s": found.get("mbit_s"), "rtt_ms": ping.get("rtt_ms"),
                     "tool": "builtin", "streams": int(found.get("streams", streams)), "seconds": found.get("seconds"),
                     "error": found.get("error") or ping.get("error")})  # fmt: skip
    return rows


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
