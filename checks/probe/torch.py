"""The torch part of the hardware seam: everything that imports torch runs in a child process with a
timeout, because a broken CUDA install can hang ``torch.cuda.is_available()`` or kill the interpreter.

The child scripts live in ``checks/probe/scripts/`` and print one JSON object on their last stdout line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from checks.facts import AllocFacts, BenchFacts, GpuBench, TorchFacts
from checks.probe import session
from checks.snapshot import machine_from_dict

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ALLOC_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class ChildFailed(Exception):
    """The child process timed out, crashed or printed no JSON; ``kind`` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def run_child(
    argv: list[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    while_running: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run a child, return the JSON object on its last stdout line; kill its process group on timeout.

    The child starts in a session of its own (``checks.probe.session``, the launcher of every child the tool
    starts), so the SIGKILL reaches whatever it started too.

    The child runs in a neutral directory: run from the checkout, ``datasets/`` would shadow Hugging Face's.
    ``while_running`` is called about every 50 ms until the child exits (used to sample NVML under load).
    """
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-") as cwd:
        proc = session.start(argv, cwd, env, subprocess.PIPE, subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise ChildFailed("timeout", f"no answer within {timeout:g} s (a hung CUDA/driver call?)")
                if while_running is not None:
                    while_running()
                time.sleep(0.05)
            out, err = proc.communicate()
        finally:
            session.stop_group(proc)  # SIGKILL to its group at once: a hung CUDA call hears nothing else
    return _parse_child(proc.returncode, out, err)


def _parse_child(code: int, out: str, err: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.strip()]
    if lines:
        try:
            data = json.loads(lines[-1])
            if isinstance(data, dict):
                return data
        except json.JSONDecodeError:
            pass
    raise ChildFailed("crashed", f"exited with {code}: {telling_line(err)[:300]}")


_ERROR_LINE = re.compile(r"^(?:\[[^\]]*\]:?\s*)*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)):\s*\S")
_LAUNCHER_NOISE = ("ChildFailedError", "torch.distributed.elastic")


def telling_line(err: str) -> str:
    """The stderr line that says what went wrong: the last exception line a process raised (``[rank0]:
    torch.distributed.DistBackendError: NCCL error ...``), not torchrun's closing table (a row of ``=``, ``Root Cause``,
    ``ChildFailedError``); else the last line with a letter in it."""
    lines = [line.strip() for line in err.splitlines() if any(ch.isalnum() for ch in line)]
    raised = [line for line in lines if _ERROR_LINE.match(line) and not any(noise in line for noise in _LAUNCHER_NOISE)]
    return (raised or lines or ["no output"])[-1]


def read_torch(python: str = sys.executable, timeout: float = 60.0) -> TorchFacts:
    """Probe the torch build of ``python`` (default: this interpreter, i.e. the training environment)."""
    try:
        data = run_child([python, str(SCRIPTS / "torch_facts.py")], timeout)
    except ChildFailed as exc:
        return TorchFacts(error=str(exc), error_kind=exc.kind)
    facts = machine_from_dict({"nvml": {}, "host": {}, "torch": data}, where="torch probe").torch
    return facts


def read_checkpoint(path: str, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """What a checkpoint file holds, as torch's default load reads it (``scripts/ckpt_contents.py``: the parts a
    resume needs, or ``{"error": ...}``); a child that fails or times out is an ``error`` too."""
    return read_checkpoints([path], timeout, python)[0]


def read_checkpoints(paths: Sequence[str], timeout: float, python: str = sys.executable) -> list[dict[str, Any]]:
    """``read_checkpoint`` of each file, all in one child: one ``import torch`` (seconds on a small box) for the
    last file a run saved and the first one verify kept aside for its resume replay."""
    try:
        data = run_child([python, str(SCRIPTS / "ckpt_contents.py"), *paths], timeout)
    except ChildFailed as exc:
        return [{"error": f"reading it took too long or crashed: {exc}"} for _ in paths]
    files = data.get("files") if len(paths) > 1 else [data]
    if not isinstance(files, list) or len(files) != len(paths):
        return [{"error": f"the reader answered {str(data)[:200]}"} for _ in paths]
    return [dict(f) for f in files]


def run_bench(
    settings: Mapping[str, Any],
    timeout: float,
    python: str = sys.executable,
    while_running: Callable[[], None] | None = None,
) -> BenchFacts:
    """Run the GPU micro-benchmarks in a child; ``settings`` go to the script as JSON."""
    argv = [python, str(SCRIPTS / "gpu_bench.py"), json.dumps(dict(settings))]
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # NVML's order, when no UUID is available
    try:
        data = run_child(argv, timeout, env=env, while_running=while_running)
    except ChildFailed as exc:
        return BenchFacts(skipped=f"GPU benchmark {exc}")
    if data.get("skipped"):
        return BenchFacts(skipped=str(data["skipped"]))
    gpus = tuple(GpuBench(**row) for row in data.get("gpus", []))
    return BenchFacts(gpus=gpus)


def read_alloc(
    wanted: str,
    variables: tuple[str, ...],
    timeout: float,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    shell: str = "bash",
) -> AllocFacts:
    """Start a fresh login shell without the allocator variables, run Python in it, read the settings back."""
    env = {k: v for k, v in (environ if environ is not None else os.environ).items() if k not in ALLOC_VARIABLES}
    variable = variables[0]
    command = f"exec {shlex.quote(python)} {shlex.quote(str(SCRIPTS / 'alloc_readback.py'))} {shlex.quote(variable)}"
    try:
        data = run_child([shell, "-l", "-c", command], timeout, env=env)
    except ChildFailed as exc:
        return AllocFacts(wanted=wanted, variable=variable, error=f"read-back {exc}")
    except FileNotFoundError:
        return AllocFacts(wanted=wanted, variable=variable, skipped=f"no {shell} to start a login shell with")
    return AllocFacts(
        wanted=wanted,
        variable=variable,
        env_seen=data.get("env"),
        torch_settings=data.get("settings"),
        source=data.get("source"),
        error=data.get("error"),
    )
