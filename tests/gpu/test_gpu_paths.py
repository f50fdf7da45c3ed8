"""The GPU paths against the real hardware: NVML, the CUDA-event timer, the datasheet row, the allocator read-back.

Everything else tests these paths with fakes and recorded snapshots; here they meet a real driver and a CUDA
torch. Skipped with the reason where there is no NVIDIA GPU (``tests/gpu/conftest.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from checks.facts import GpuBench, GpuFacts
from checks.machine.bench import METRICS
from checks.probe.nvml import read_nvml
from checks.probe.torch import SCRIPTS, read_alloc, run_bench
from checks.reports.verify import Device
from checks.tables import datasheet
from checks.verify.contract import ChildResult
from checks.verify.report import mfu
from provision.alloc_env import ensure_alloc_conf
from tests.factories import script_module

pytestmark = pytest.mark.gpu
GIB = 1024**3


def gpu_bench_script() -> ModuleType:
    """checks/probe/scripts/gpu_bench.py as a module: it is a child script, not part of a package."""
    return script_module("gpu_bench", SCRIPTS / "gpu_bench.py")


def answering_gpus() -> list[GpuFacts]:
    return [g for g in read_nvml().gpus if not g.error]


# --- NVML ------------------------------------------------------------------------------------------------------


def test_nvml_reads_the_driver_and_counts_what_nvidia_smi_lists() -> None:
    facts = read_nvml()
    assert facts.error is None, facts.error
    assert facts.driver_version and re.fullmatch(r"\d+\.\d+(\.\d+)*", facts.driver_version)
    assert facts.cuda_driver_version and facts.cuda_driver_version >= 11000  # 12080 is CUDA 12.8
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
        assert len(facts.gpus) == len(re.findall(r"^GPU \d+:", listed, re.M)), listed


def test_nvml_reads_every_gpu_without_error() -> None:
    for g in read_nvml().gpus:
        assert g.error is None, f"gpu{g.index} stopped answering: {g.error}"
        assert not g.query_errors, f"gpu{g.index} ({g.name}) queries failed: {g.query_errors}"


def test_nvml_fields_are_plausible() -> None:
    for g in answering_gpus():
        where = f"gpu{g.index} {g.name}"
        assert g.name.strip() and g.uuid and g.uuid.startswith(("GPU-", "MIG-")), where
        assert g.bus_id and re.search(r"[0-9a-f]{2}:[0-9a-f]{2}\.\d$", g.bus_id.lower()), (where, g.bus_id)
        assert g.compute_capability and g.compute_capability >= (3, 5), (where, g.compute_capability)
        assert g.memory_total and g.memory_total > 2 * GIB, (where, g.memory_total)
        assert g.memory_used is not None and 0 <= g.memory_used <= g.memory_total, where
        assert g.pcie_gen_max is None or 1 <= g.pcie_gen_max <= 6, (where, g.pcie_gen_max)
        assert g.pcie_width_max is None or g.pcie_width_max in (1, 2, 4, 8, 16, 32), (where, g.pcie_width_max)
        assert g.temperature_c is None or 0 <= g.temperature_c <= 110, (where, g.temperature_c)
        assert g.power_limit_mw is None or 10_000 <= g.power_limit_mw <= 2_000_000, (where, g.power_limit_mw)
        assert g.sm_clock_max_mhz is None or 300 <= g.sm_clock_max_mhz <= 4000, (where, g.sm_clock_max_mhz)


# --- the datasheet table ----------------------------------------------------------------------------------------


def _matmul_dtype(cc: tuple[int, int]) -> str:
    """The dtype gpu_bench.py multiplies in on this card (its _dtype: bf16 from sm_80, fp16 on sm_7x)."""
    return "bfloat16" if cc >= (8, 0) else "float16" if cc >= (7, 0) else "float32"


def test_datasheet_has_this_card_and_its_peak() -> None:
    matmul = next(m for m in METRICS if m.id == "gpu-matmul")
    for g in answering_gpus():
        spec = datasheet.lookup(g.name)
        assert spec is not None, (
            f"{g.name!r} (NVML) is not in templates/gpus.yaml: add its row (docs/sources.md#gpu-datasheets)"
        )
        assert spec.cc == g.compute_capability, (g.name, spec.cc, g.compute_capability)
        assert g.memory_total and 0.85 <= g.memory_total / GIB / spec.memory_gb <= 1.1, (g.name, g.memory_total)
        assert g.compute_capability is not None
        dtype = _matmul_dtype(g.compute_capability)
        if dtype != "float32":
            assert matmul.spec(spec, GpuBench(index=g.index, matmul_dtype=dtype)), f"no {dtype} peak for {spec.model}"


def test_verify_finds_the_peak_under_torchs_device_name(cuda_torch: Any) -> None:
    """verify's MFU looks the card up by torch's name, which need not be NVML's."""
    for i in range(cuda_torch.cuda.device_count()):
        name, cc = cuda_torch.cuda.get_device_name(i), cuda_torch.cuda.get_device_capability(i)
        precision = "bf16" if cc >= (8, 0) else "fp16"
        got = mfu(ChildResult(device=Device("cuda", name), precision=precision, flops_per_step=10**12), 1.0)
        assert got.value is not None and got.peak_tflops, f"torch's {name!r}: {got.note}"


# --- the CUDA-event timer ----------------------------------------------------------------------------------------


def _timed(torch: Any, timer: Any, cycles: int) -> tuple[float, float]:
    """(CUDA-event seconds, wall seconds around the same call) of one sleep kernel of ``cycles`` clock cycles."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    events = timer(lambda: torch.cuda._sleep(cycles))
    return events, time.perf_counter() - start


def test_cuda_event_timer_agrees_with_wall_time_on_a_sleep_kernel(cuda_torch: Any) -> None:
    torch = cuda_torch
    torch.cuda.set_device(0)
    timer = gpu_bench_script()._timer(torch, "cuda:0")
    _timed(torch, timer, 1_000_000)  # warm-up: context, module load, clocks up
    probe, _ = _timed(torch, timer, 10_000_000)
    cycles = int(10_000_000 * 0.2 / probe)  # about 0.2 s at this clock
    short, short_wall = _timed(torch, timer, cycles)
    long, long_wall = _timed(torch, timer, 2 * cycles)
    for events, wall in ((short, short_wall), (long, long_wall)):
        # The events sit inside the wall-clock window; launch and synchronize cost well under 10% of 0.2 s.
        assert 0.9 * wall <= events <= wall + 1e-3, (events, wall)
    assert 1.8 <= long / short <= 2.2, (short, long)  # twice the cycles, twice the time


def test_gpu_bench_child_measures_every_gpu(cuda_torch: Any) -> None:
    settings = {"copy_mib": 64, "d2d_mib": 64, "matmul_n": 2048, "warmup": 2, "repeats": 5}
    facts = run_bench(settings, timeout=180)
    assert facts.skipped is None, facts.skipped
    assert len(facts.gpus) == cuda_torch.cuda.device_count()
    for row in facts.gpus:
        assert row.error is None, row.error
        assert row.uuid, "torch reports no device UUID: CUDA and NVML indices cannot be joined"
        assert row.h2d_gb_s and row.d2h_gb_s and row.d2d_gb_s and row.matmul_tflops
        cc = cuda_torch.cuda.get_device_capability(row.index)
        assert row.matmul_dtype == _matmul_dtype(cc)


# --- the allocator read-back ---------------------------------------------------------------------------------------


def test_alloc_read_back_on_a_cuda_torch(cuda_torch: Any, tmp_path: Path) -> None:
    """A fresh login shell's torch reports the setting through the CUDA caching allocator's own snapshot."""
    home, value, variables = tmp_path / "home", "expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",)
    ensure_alloc_conf([home / ".profile"], value, variables)
    facts = read_alloc(value, variables, 120, environ={**os.environ, "HOME": str(home)})
    assert facts.error is None and facts.skipped is None, facts.error or facts.skipped
    assert facts.env_seen == value
    cuda_torch.zeros(1, device="cuda")
    if "allocator_settings" in cuda_torch.cuda.memory._snapshot():
        assert facts.source == "cuda-snapshot", facts
    assert facts.torch_settings, facts
    settings = dict(item.split(":", 1) for item in facts.torch_settings.replace(" ", "").split(",") if ":" in item)
    assert settings.get("expandable_segments", "").casefold() == "true", facts.torch_settings
