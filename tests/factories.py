"""Builders for facts records (and the report blocks bootstrap writes from them) in unit tests: a healthy
default, changed field by field."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from checks.config import PreflightConfig, make_config
from checks.facts import GpuFacts, HostFacts, MachineFacts, NvmlFacts, TorchFacts
from checks.machine.measurements import environment as environment_of
from checks.machine.measurements import measurements
from checks.reports.bootstrap import BootstrapMeasurements, Environment

GIB = 1024**3

H100 = GpuFacts(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-0",
    bus_id="00000000:18:00.0",
    brand="nvidia",
    compute_capability=(9, 0),
    memory_total=80 * GIB,
    memory_used=1 * GIB,
    memory_reserved=1 * GIB,
    power_limit_mw=700_000,
    power_default_limit_mw=700_000,
    power_enforced_limit_mw=700_000,
    pcie_gen_current=1,
    pcie_gen_max=5,
    pcie_gen_gpu_max=5,
    pcie_width_current=16,
    pcie_width_max=16,
    nvlink_total=18,
    nvlink_active=18,
    clock_event_reasons=0x1,
    ecc_enabled=True,
    ecc_uncorrected_volatile=0,
    ecc_uncorrected_aggregate=0,
    mig_enabled=False,
    persistence_mode=True,
    compute_mode=0,
    processes=(),
)

TORCH_CU128 = TorchFacts(
    version="2.8.0+cu128",
    cuda="12.8",
    arch_list=("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
    cudnn_version=91002,
    cudnn_compiled_version="9.10.2",
    nccl_version="2.27.3",
    cuda_available=True,
    device_count=1,
)

HOST = HostFacts(
    hostname="box",
    cpu_logical=32,
    cpu_affinity=32,
    mem_total=256 * GIB,
    shm_total=64 * GIB,
    nofile_soft=1048576,
    nofile_hard=1048576,
    memlock_soft=-1,
    memlock_hard=-1,
)


def gpu(index: int = 0, **changes: Any) -> GpuFacts:
    return replace(H100, index=index, uuid=f"GPU-{index}", **changes)


def machine(
    gpus: tuple[GpuFacts, ...] | None = None,
    nvml: dict[str, Any] | None = None,
    torch: dict[str, Any] | None = None,
    host: dict[str, Any] | None = None,
    **rest: Any,
) -> MachineFacts:
    nv = NvmlFacts(driver_version="570.124.06", cuda_driver_version=12080, gpus=gpus if gpus is not None else (gpu(),))
    return MachineFacts(
        nvml=replace(nv, **(nvml or {})),
        torch=replace(TORCH_CU128, **(torch or {})),
        host=replace(HOST, **(host or {})),
        **rest,
    )


def config(**sections: dict[str, Any]) -> PreflightConfig:
    """The default config with some keys changed: config(gpu={"power_min_fraction": 0.5})."""
    return make_config(sections) if sections else make_config()


def bootstrap_measurements(m: MachineFacts | None = None, **changes: Any) -> BootstrapMeasurements:
    """The measurements bootstrap's writer builds for ``m`` (the healthy default box), blocks changed by name:
    bootstrap_measurements(environment=None) is a report written before the environment block."""
    return replace(measurements(m or machine(), config(), []), **changes)


def environment(**changes: Any) -> Environment:
    """The environment block of the default box, with a readable OS, Python and a package, changed field by field."""
    base = replace(environment_of(machine()), os="Ubuntu 22.04.5 LTS", python="3.11.9", packages={"numpy": "2.1.0"})
    return replace(base, **changes)


def script_module(name: str, path: Path) -> ModuleType:
    """A child script of the tool (``checks/probe/scripts/*.py``, a template) loaded as a module: it is not part
    of a package, so it is imported from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
