"""The ``measurements`` part of bootstrap's report: the figures behind the results, for people and scripts.

A fleet run reads the same keys back from every host's JSON (``checks/fleet/report.py``).
"""

from __future__ import annotations

from typing import Any

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.collective import collective_measurements
from checks.machine.disk import disk_measurements
from checks.machine.network import net_measurements
from checks.machine.resources import loader_advice
from checks.machine.topology import topology_measurements
from checks.typedjson import dump


def inventory(m: MachineFacts) -> dict[str, Any]:
    """Summarise a host's accelerators for the fleet (all-reduce backend, GPU outliers)."""
    names = [g.name for g in m.nvml.gpus if not g.error]
    return {
        "gpus": len(names),
        "gpu_names": names,
        "torch": m.torch.version,
        "cuda": m.torch.cuda_available,
        "nccl": m.torch.nccl_version,
    }


def environment(m: MachineFacts) -> dict[str, Any]:
    """The software a run depends on, for the report's one-line summary, ``invoke diff`` and the fleet's drift table.

    ``packages`` is every installed distribution (name -> version); absent keys were not readable.
    """
    t, e, n = m.torch, m.env, m.nvml
    fields: dict[str, Any] = {
        "os": (e.os_name if e else None),
        "glibc": (e.glibc if e else None),
        "python": (e.python if e else None) or m.host.python,
        "torch": t.version,
        "torch_cuda": t.cuda,
        "nccl": t.nccl_version,
        "cudnn": t.cudnn_compiled_version,
        "driver": n.driver_version,
        "driver_cuda": _cuda_text(n.cuda_driver_version),
        "nvcc": (e.nvcc_version if e else None),
    }
    summary = " · ".join(
        part
        for part in (
            fields["os"] or ("OS unknown" if e else "OS not recorded"),
            f"Python {fields['python'] or '?'}",
            f"torch {t.version or 'missing'}"
            + (f" (CUDA {t.cuda})" if t.cuda else " (CPU build)" if t.version else ""),
            f"driver {n.driver_version} (CUDA {fields['driver_cuda']})" if n.driver_version else "no NVIDIA driver",
            f"nvcc {fields['nvcc']}" if fields["nvcc"] else "no nvcc" if e else "nvcc not recorded",
        )
    )
    return {"summary": summary, **fields, "packages": dict(e.packages) if e else {}}


def _cuda_text(version: int | None) -> str | None:
    """12080 -> "12.8" (NVML's cudaDriverGetVersion encoding: 1000 x major + 10 x minor)."""
    return f"{version // 1000}.{version % 1000 // 10}" if version else None


def host_measurements(m: MachineFacts) -> dict[str, Any]:
    """Build the disk, download, inventory and environment parts of a host's ``measurements``."""
    return {**disk_measurements(m), **net_measurements(m), "inventory": inventory(m), "environment": environment(m)}


def measurements(facts: MachineFacts, cfg: PreflightConfig, notes: list[str]) -> dict[str, Any]:
    """The report's ``measurements``: DataLoader advice, benchmarks, PCIe under load, the host's figures."""
    out: dict[str, Any] = {"dataloader": loader_advice(facts, cfg).as_dict()}
    if facts.bench is not None and facts.bench.gpus:
        out["gpu_bench"] = dump(facts.bench.gpus)
    links = {
        f"gpu{g.index}": {"gen": g.pcie_gen_loaded, "width": g.pcie_width_loaded}
        for g in facts.nvml.gpus
        if g.pcie_gen_loaded
    }
    if links:
        out["pcie_under_load"] = links
    topology = topology_measurements(facts)
    if topology:
        out["topology"] = topology
    out.update(collective_measurements(facts))  # p2p, allreduce_local
    if notes:
        out["alloc_conf_changes"] = notes
    out.update(host_measurements(facts))  # disks, mounts, downloads, inventory
    return out
