"""One host's part of ``invoke verify --hosts`` (parent side, no torch): run there from the shipped checkout.

``python -m checks.verify.smoke.node probe [PORT_FOR]``: one JSON line, what the controller plans with: the GPUs
torch sees, the usable cores, and (with ``PORT_FOR``, on rank 0's host) a free port for the rendezvous.

``python -m checks.verify.smoke.node run SPEC``: SPEC is verify's child spec with a ``node`` block (``addr``,
``port``, ``first``, ``local``, ``index``, ``nodes``: ``launch.Node``); the local ranks run under
``launch.launch``, with ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set to the interface that reaches rank 0's host
(both libraries pick an address from the hostname otherwise, which other hosts may not reach; the user's own
setting wins). The last line printed is the run as JSON (``ChildRun.to_json``). SIGTERM and SIGHUP (the
controller stopping this host, or its SSH session gone) stop every local rank and leave no process behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from checks.errors import terminate_as_interrupt
from checks.probe.host import read_host
from checks.probe.tcp import free_port, route
from checks.probe.torch import read_torch
from checks.verify.contract import RunSpec
from checks.verify.smoke.launch import Node, launch


def probe(port: bool) -> dict[str, Any]:
    """What this host brings: GPUs torch sees (and whether it has NCCL), usable cores, a free port."""
    torch = read_torch(sys.executable, 60.0)
    found: dict[str, Any] = {"gpus": int(torch.device_count or 0) if torch.cuda_available else 0}
    found["cores"] = read_host().usable_cores
    found |= {"torch": torch.error is None and bool(torch.version), "torch_error": torch.error}
    found["nccl"] = bool(torch.nccl_version) and torch.cuda_available
    if port:
        found["port"] = free_port()
    return found


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run this host's ranks; return the run (rank numbers global, the first local rank's result)."""
    node = Node(**spec.pop("node"))
    iface = route(node.addr).get("interface")
    env = {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}
    timeout, stall = float(spec.pop("timeout_s")), float(spec.pop("stall_s"))
    with terminate_as_interrupt():
        try:
            done = launch(RunSpec.from_json(spec), timeout, stall, extra_env=env, node=node)
        except KeyboardInterrupt:  # a second signal while the ranks were being stopped: they are gone by now
            return {"result": None, "failure": "killed", "interrupted": True}
    return done.to_json()


def main(argv: list[str]) -> int:
    if argv[1:2] == ["probe"]:
        print(json.dumps(probe(len(argv) > 2)))
        return 0
    if argv[1:2] == ["run"] and len(argv) == 3:
        print(json.dumps(run(json.loads(Path(argv[2]).read_text(encoding="utf-8"))), default=str))
        return 0
    print("usage: python -m checks.verify.smoke.node probe [port] | run SPEC", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
