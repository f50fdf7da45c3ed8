"""One host's part of ``invoke verify --hosts`` on the command path (parent side, no torch): run from the shipped
checkout by the controller (``checks/verify/hosts.py``).

``python -m checks.verify.user.node probe [port]``: one JSON line, what the controller plans with (the GPUs torch
sees and whether it has NCCL, the usable cores, and with ``port``, on rank 0's host, a free port for the
rendezvous): ``probe``.

``python -m checks.verify.user.node run SPEC``: SPEC (JSON) holds this node's part of one multi-node torchrun job:

- ``launch``: torchrun's flags for this node (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``,
  ``--nproc-per-node``, and the user's others); ``program``: the script and its arguments (or ``-m MODULE ...``).
  The node runs ``<this Python> -m torch.distributed.run LAUNCH PROGRAM`` under the agent (``launch.run_command``),
  in ``cwd`` (an error where this host has no such folder), with ``env`` added where this host's environment does not set the name already;
- ``warmup``: the steps verify leaves out (the agent counts the FLOPs of the last one); ``steps`` (a user's command,
  whose step count verify cannot set): stop this node's ranks once each has made ``warmup + steps`` steps (SIGINT,
  as on one box); absent for the tool's script;
- ``first_step_s``, ``stall_s``: a node whose ranks make no step by then, or stop stepping, is stopped.

The tool's script ends by itself: every node must end together, so the controller gives it its exact step count
and nothing here stops it after a number of steps (a SIGINT to one node's ranks while the others finish their last
step can read there as a lost peer). ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` name the interface that reaches rank
0's host (``master_addr``): both libraries pick an address from the hostname otherwise, which other hosts may not
reach; the user's own setting wins.

The last line printed is the run as JSON: the ``CommandRun``'s fields (``events``, ``returncode``, ``ended``,
``stop_reason``, ``signals``, ``pids``, ``left``, ``seconds``, ``interrupted``, ``stderr_tail``). SIGTERM and SIGHUP
(the controller stopping this host, or its SSH session gone) stop the ranks as Ctrl-C does (SIGINT to torchrun's
process group, then SIGTERM, SIGKILL) and leave no process behind. torchrun's logs go to a temporary folder of the
run (``--log-dir``, unless the command names its own), removed after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from checks.errors import terminate_as_interrupt
from checks.probe.host import read_host
from checks.probe.tcp import free_port, route
from checks.probe.torch import read_torch
from checks.verify.user.launch import CommandRun, StopRule, run_command

# The node's rule counts no steps: the program ends by itself after the steps the controller gave it.
NEVER = 1 << 40
FIELDS = ("events", "returncode", "ended", "stop_reason", "signals", "pids", "left", "seconds", "interrupted")
SOCKET_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


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


def argv(spec: dict[str, Any]) -> list[str]:
    """This node's command line: torchrun (as this Python's module) with its flags, then the program."""
    return [sys.executable, "-m", "torch.distributed.run", *spec["launch"], *spec["program"]]


def added_env(spec: dict[str, Any], environ: dict[str, str]) -> dict[str, str]:
    """The variables this node adds: the controller's (``env``) and the interface toward rank 0's host; a name
    this host's environment sets already is left as it is."""
    iface = route(str(spec["master_addr"])).get("interface") if spec.get("master_addr") else None
    extra = {name: iface for name in SOCKET_ENV} if iface else {}
    extra |= {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    return {k: v for k, v in extra.items() if k not in environ}


def to_json(run: CommandRun) -> dict[str, Any]:
    out = {name: getattr(run, name) for name in FIELDS}
    out["events"] = [e.to_json() for e in run.events]  # each read back by checks.verify.events.parse
    out |= {"pids": sorted(run.pids), "stderr_tail": run.stderr_tail, "argv": list(run.argv)}
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run this node's ranks until the program ends (or a signal stops them); the run's fields."""
    command = argv(spec)
    extra = added_env(spec, dict(os.environ))
    os.environ.update(extra)  # run_command starts the command with this process's environment
    rule = StopRule(
        warmup=int(spec["warmup"]),
        steps=int(spec.get("steps") or 0) or NEVER,
        first_step_s=float(spec["first_step_s"]),
        stall_s=float(spec["stall_s"]),
    )
    cwd = spec.get("cwd") or os.getcwd()
    if not os.path.isdir(cwd):
        return {"argv": command, "error": f"no folder {cwd} here (verify --hosts runs the command from the same path)"}
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-torchrun-") as logs, terminate_as_interrupt():
        if not any(f.split("=")[0] in ("--log-dir", "--log_dir") for f in spec["launch"]):
            command.insert(3, f"--log-dir={logs}")  # else torchrun leaves a torchelastic_* folder in the temp dir
        try:
            done = run_command(command, rule, cwd, None, subprocess.DEVNULL, split=True)
        except KeyboardInterrupt:  # a second signal while the ranks were being stopped: they are gone by now
            return {"argv": command, "ended": "interrupted", "interrupted": True, "events": [], "returncode": None}
    return to_json(done) | {"env": extra}


def main(args: list[str]) -> int:
    if args[1:2] == ["probe"]:
        print(json.dumps(probe(len(args) > 2)))
        return 0
    if args[1:2] == ["run"] and len(args) == 3:
        print(json.dumps(run(json.loads(Path(args[2]).read_text(encoding="utf-8"))), default=str))
        return 0
    print("usage: python -m checks.verify.user.node probe [port] | run SPEC", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
