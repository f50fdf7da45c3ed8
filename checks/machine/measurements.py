"""The ``measurements`` part of bootstrap's report: the figures behind the results, for people and scripts.

A fleet run reads the same keys back from every host's JSON (``checks/fleet/report.py``).
"""

from __future__ import annotations

from typing import Any

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.disk import disk_measurements
from checks.machine.network import net_measurements
from checks.machine.resources import loader_advice
from checks.snapshot import to_jsonable


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


def host_measurements(m: MachineFacts) -> dict[str, Any]:
    """Build the disk, download and inventory parts of a host's ``measurements``."""
    return {**disk_measurements(m), **net_measurements(m), "inventory": inventory(m)}


def measurements(facts: MachineFacts, cfg: PreflightConfig, notes: list[str]) -> dict[str, Any]:
    """The report's ``measurements``: DataLoader advice, benchmarks, PCIe under load, the host's figures."""
    out: dict[str, Any] = {"dataloader": loader_advice(facts, cfg).as_dict()}
    if facts.bench is not None and facts.bench.gpus:
        out["gpu_bench"] = to_jsonable(facts.bench.gpus)
    links = {
        f"gpu{g.index}": {"gen": g.pcie_gen_loaded, "width": g.pcie_width_loaded}
        for g in facts.nvml.gpus
        if g.pcie_gen_loaded
    }
    if links:
        out["pcie_under_load"] = links
    if notes:
        out["alloc_conf_changes"] = notes
    out.update(host_measurements(facts))  # disks, mounts, downloads, inventory
    return out
