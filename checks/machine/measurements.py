"""The ``measurements`` part of bootstrap's report: the figures behind the results, for people and scripts.

It builds ``checks.reports.bootstrap.BootstrapMeasurements``, the record its readers read back (``invoke diff``, a
fleet run's outliers, drift table and all-reduce plan, from every host's JSON).
"""

from __future__ import annotations

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.collective import allreduce_measurements, p2p_measurements
from checks.machine.disk import disk_measurements
from checks.machine.network import net_measurements
from checks.machine.resources import loader_advice
from checks.machine.topology import topology_measurements
from checks.reports.bootstrap import (
    BootstrapMeasurements,
    Dataloader,
    Environment,
    GpuBenchRow,
    Inventory,
    PcieLink,
    row_of,
)


def inventory(m: MachineFacts) -> Inventory:
    """Summarise a host's accelerators for the fleet (all-reduce backend, GPU outliers)."""
    names = tuple(g.name for g in m.nvml.gpus if not g.error)
    return Inventory(
        gpus=len(names), gpu_names=names, torch=m.torch.version, cuda=m.torch.cuda_available, nccl=m.torch.nccl_version
    )


def environment(m: MachineFacts) -> Environment:
    """The software a run depends on, for the report's one-line summary, ``invoke diff`` and the fleet's drift table.

    ``packages`` is every installed distribution (name -> version); None fields were not readable.
    """
    t, e, n = m.torch, m.env, m.nvml
    os_name = e.os_name if e else None
    python = (e.python if e else None) or m.host.python
    nvcc = e.nvcc_version if e else None
    driver_cuda = _cuda_text(n.cuda_driver_version)
    summary = " · ".join(
        part
        for part in (
            os_name or ("OS unknown" if e else "OS not recorded"),
            f"Python {python or '?'}",
            f"torch {t.version or 'missing'}"
            + (f" (CUDA {t.cuda})" if t.cuda else " (CPU build)" if t.version else ""),
            f"driver {n.driver_version} (CUDA {driver_cuda})" if n.driver_version else "no NVIDIA driver",
            f"nvcc {nvcc}" if nvcc else "no nvcc" if e else "nvcc not recorded",
        )
    )
    return Environment(
        summary=summary,
        os=os_name,
        glibc=(e.glibc if e else None),
        python=python,
        torch=t.version,
        torch_cuda=t.cuda,
        nccl=t.nccl_version,
        cudnn=t.cudnn_compiled_version,
        driver=n.driver_version,
        driver_cuda=driver_cuda,
        nvcc=nvcc,
        packages=dict(e.packages) if e else {},
    )


def _cuda_text(version: int | None) -> str | None:
    """12080 -> "12.8" (NVML's cudaDriverGetVersion encoding: 1000 x major + 10 x minor)."""
    return f"{version // 1000}.{version % 1000 // 10}" if version else None


def measurements(facts: MachineFacts, cfg: PreflightConfig, notes: list[str]) -> BootstrapMeasurements:
    """The report's ``measurements``: DataLoader advice, benchmarks, PCIe under load, the host's figures."""
    advice = loader_advice(facts, cfg)
    bench = facts.bench.gpus if facts.bench is not None else ()
    links = {
        f"gpu{g.index}": PcieLink(g.pcie_gen_loaded, g.pcie_width_loaded) for g in facts.nvml.gpus if g.pcie_gen_loaded
    }
    disks = disk_measurements(facts)
    return BootstrapMeasurements(
        dataloader=row_of(Dataloader, advice),
        gpu_bench=tuple(row_of(GpuBenchRow, g) for g in bench) or None,
        pcie_under_load=links or None,
        topology=topology_measurements(facts),
        p2p=p2p_measurements(facts),
        allreduce_local=allreduce_measurements(facts),
        alloc_conf_changes=tuple(notes) or None,
        disks=disks[0] if disks else None,
        mounts=disks[1] if disks else None,
        downloads=net_measurements(facts),
        inventory=inventory(facts),
        environment=environment(facts),
    )
