"""GPU-to-GPU measurements inside one box, each in child processes with a timeout.

``run_p2p`` runs ``scripts/p2p_bench.py`` (copy bandwidth per ordered GPU pair); ``run_local_allreduce`` runs
``scripts/allreduce.py`` (the script bootstrap --hosts runs across hosts) under ``torch.distributed.run
--standalone``, one process per GPU: NCCL on GPUs, gloo on CPUs. A timeout kills the whole process group, so no
rank outlives it. The CUDA paths cannot run without a GPU; their parsing is ``p2p_facts`` and
``allreduce_facts``, which the tests feed recorded outputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from checks.config import PreflightConfig
from checks.facts import AllreduceFacts, LocalAllreduceFacts, MachineFacts, P2PBandwidth, P2PFacts, TopologyFacts
from checks.probe.nvml import read_topology, uuid_key
from checks.probe.torch import SCRIPTS, ChildFailed, run_child


def p2p_facts(data: Mapping[str, Any], nvml_uuids: Sequence[str | None] = ()) -> P2PFacts:
    """Turn p2p_bench.py's JSON into facts, renumbering CUDA indices to NVML's by UUID where both are known."""
    if data.get("skipped"):
        return P2PFacts(skipped=str(data["skipped"]))
    by_uuid = {uuid_key(u): i for i, u in enumerate(nvml_uuids) if u}
    cuda_uuids = list(data.get("uuids") or [])

    def nvml_index(cuda: int) -> int:
        uuid = cuda_uuids[cuda] if cuda < len(cuda_uuids) else None
        return by_uuid.get(uuid_key(uuid), cuda) if uuid else cuda

    pairs = tuple(
        P2PBandwidth(
            src=nvml_index(int(row["src"])),
            dst=nvml_index(int(row["dst"])),
            gb_s=row.get("gb_s"),
            peer_access=row.get("peer_access"),
            error=row.get("error"),
        )
        for row in data.get("pairs", [])
    )
    return P2PFacts(pairs=pairs, mib=data.get("mib"))


def run_p2p(
    settings: Mapping[str, Any], timeout: float, nvml_uuids: Sequence[str | None] = (), python: str = sys.executable
) -> P2PFacts:
    """Measure every ordered GPU pair's copy bandwidth in a child; ``settings`` go to the script as JSON."""
    argv = [python, str(SCRIPTS / "p2p_bench.py"), json.dumps(dict(settings))]
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # NVML's order, when no UUID is available
    try:
        data = run_child(argv, timeout, env=env)
    except ChildFailed as exc:
        return P2PFacts(skipped=f"p2p benchmark {exc}")
    return p2p_facts(data, nvml_uuids)


def allreduce_facts(data: Mapping[str, Any]) -> LocalAllreduceFacts:
    """Turn allreduce.py's JSON (rank 0's line) into facts; ``{"error": ...}`` or no rows is a failed run."""
    if data.get("error") or not data.get("rows"):
        return LocalAllreduceFacts(error=str(data.get("error") or "the all-reduce printed no rows"))
    return LocalAllreduceFacts(rows=tuple(AllreduceFacts(**row) for row in data["rows"]))


def run_local_allreduce(
    nproc: int,
    backend: str,
    max_mib: int,
    budget_s: float,
    timeout_s: float,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
) -> LocalAllreduceFacts:
    """All-reduce sweep over ``nproc`` local processes (one per GPU with NCCL), up to ``max_mib`` within ``budget_s``.

    Command line equivalent: torchrun --standalone --nproc-per-node N checks/probe/scripts/allreduce.py
    """
    argv = [
        python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
        str(SCRIPTS / "allreduce.py"), "--backend", backend, "--max-mib", str(max_mib),
        "--budget-s", str(budget_s), "--timeout-s", str(timeout_s),
    ]  # fmt: skip
    env = {**(environ if environ is not None else os.environ), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    try:
        data = run_child(argv, timeout_s + 30, env=env)
    except ChildFailed as exc:
        return LocalAllreduceFacts(error=f"all-reduce {exc}")
    return allreduce_facts(data)


def interfaces() -> tuple[str, ...] | None:
    """The host's network interface names (for NCCL_SOCKET_IFNAME). Command line equivalent: ip -br link"""
    try:
        import psutil

        return tuple(sorted(psutil.net_if_addrs()))
    except (ImportError, OSError):
        return None


def read_box_topology() -> TopologyFacts:
    """NVML's topology of this box's GPUs, with the host's interface names."""
    return dataclasses.replace(read_topology(), interfaces=interfaces())


def _precondition(facts: MachineFacts, cfg: PreflightConfig) -> str | None:
    gpus = [g for g in facts.nvml.gpus if g.error is None] if not facts.nvml.error else []
    if not cfg.bench.enabled:
        return "disabled (preflight.bench.enabled: false, or --no-bench)"
    if len(gpus) < 2:
        return "fewer than two GPUs"
    if not facts.torch.cuda_available or facts.torch.device_count < 2:
        return "torch cannot use two or more GPUs here (see torch-build, cuda-compat and nccl-env)"
    return None


def measure_collective(facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
    """The p2p copy matrix and the NCCL all-reduce over every GPU torch sees, each bounded by its config budget."""
    tc, reason = cfg.topology, _precondition(facts, cfg)
    if reason:
        return dataclasses.replace(
            facts, p2p=P2PFacts(skipped=reason), allreduce_local=LocalAllreduceFacts(skipped=reason)
        )
    uuids = [g.uuid for g in sorted(facts.nvml.gpus, key=lambda g: g.index)]
    settings = {"mib": tc.p2p_mib, "warmup": tc.p2p_warmup, "repeats": tc.p2p_repeats}
    p2p = (
        run_p2p(settings, tc.p2p_timeout_s, uuids)
        if tc.p2p
        else P2PFacts(skipped="disabled (preflight.topology.p2p: false)")
    )
    allreduce = (
        run_local_allreduce(
            facts.torch.device_count, "nccl", tc.allreduce_max_mib, tc.allreduce_budget_s, tc.allreduce_timeout_s
        )
        if tc.allreduce
        else LocalAllreduceFacts(skipped="disabled (preflight.topology.allreduce: false)")
    )
    return dataclasses.replace(facts, p2p=p2p, allreduce_local=allreduce)
