"""Gather one record per node of a job through torch's TCPStore (child process: imports torch).

    python job_gather.py '{"addr": A, "port": P, "rank": R, "world": W, "host_store": bool, "prefix": S,
                           "node": I, "record": PATH|null, "nodes": N, "wait_s": T}'

Each node leader (``record`` names its report file) sets ``PREFIX/node/I``; rank ``0`` hosts the store (unless
torchrun's agent does: ``host_store`` false) and waits up to ``wait_s`` for the ``N`` nodes' keys. A node whose key
never comes is left out: the parent names it ("no result from NODE"), so one dead node cannot hang the job's
report. Rank 0 prints ``{"records": {I: text}, "missing": [I...], "seconds": s, "allreduce": {...}}``; the others
``{"sent": bool}``. Rank 0 sets ``PREFIX/done`` when it has read them ("1": every node reported and
``allreduce_budget_s`` > 0), and the others wait for it (up to ``wait_s``); on "1" every rank then joins one process
group on the same store for ``allreduce.py``'s size sweep across the nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any


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
            allreduce(store, args)
        return {"sent": bool(record)}
    keys = {i: f"{prefix}/node/{i}" for i in range(int(args["nodes"]))}
    deadline = began + float(args["wait_s"])
    while time.monotonic() < deadline and not store.check(list(keys.values())):  # True once every key is set
        time.sleep(0.05)
    records = {i: store.get(k).decode("utf-8") for i, k in keys.items() if store.check([k])}
    missing = [i for i in keys if i not in records]
    sweep = float(args.get("allreduce_budget_s") or 0) > 0 and not missing
    store.set(f"{prefix}/done", "1" if sweep else "0")  # every rank takes part in the all-reduce, or none does
    out: dict = {"records": records, "missing": missing, "seconds": round(time.monotonic() - began, 3)}
    if sweep:
        out["allreduce"] = allreduce(store, args)
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


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
