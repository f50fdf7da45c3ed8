"""Gather one record per node of a job through torch's TCPStore (child process: imports torch).

    python job_gather.py '{"addr": A, "port": P, "rank": R, "world": W, "host_store": bool, "prefix": S,
                           "node": I, "record": PATH|null, "nodes": N, "wait_s": T}'

Each node leader (``record`` names its report file) sets ``PREFIX/node/I``; rank ``0`` hosts the store (unless
torchrun's agent does: ``host_store`` false) and waits up to ``wait_s`` for the ``N`` nodes' keys. A node whose key
never comes is left out: the parent names it ("no result from NODE"), so one dead node cannot hang the job's
report. Rank 0 prints ``{"records": {I: text}, "missing": [I...], "seconds": s}``; the others ``{"sent": bool}``.
Rank 0 sets ``PREFIX/done`` when it has read them, and the others wait for it (up to ``wait_s``) so the store they
wrote to outlives their keys' reading.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import time
from pathlib import Path


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
        with contextlib.suppress(Exception):  # rank 0 gave up or went away: this node's part is done either way
            store.wait([f"{prefix}/done"], wait)
        return {"sent": bool(record)}
    keys = {i: f"{prefix}/node/{i}" for i in range(int(args["nodes"]))}
    deadline = began + float(args["wait_s"])
    while time.monotonic() < deadline and not all(store.check([k]) for k in keys.values()):
        time.sleep(0.05)
    records = {i: store.get(k).decode("utf-8") for i, k in keys.items() if store.check([k])}
    store.set(f"{prefix}/done", "1")
    missing = [i for i in keys if i not in records]
    return {"records": records, "missing": missing, "seconds": round(time.monotonic() - began, 3)}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
