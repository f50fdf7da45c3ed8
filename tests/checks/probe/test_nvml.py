"""Tests for the NVML adapter, against a fake pynvml that describes each GPU as data (tests/fakes/nvml.py).

The fake re-exports the real ``pynvml`` exception classes and constants, so the adapter's error mapping is
exercised with what nvidia-ml-py really raises; only the functions are replaced.
"""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from checks.facts import GpuFacts, GpuProcess, NvmlFacts, RemappedRows
from checks.probe.nvml import PcieLinkSampler, Query, read_nvml, uuid_key
from tests.fakes.nvml import GIB, MEM_V1, FakeNvml, geforce, h100

H100_FACTS = GpuFacts(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-5d0a8c1e-0000-0000-0000-000000000000",
    bus_id="00000000:18:00.0",
    pci_device_id=0x233010DE,
    brand="nvidia",
    compute_capability=(9, 0),
    memory_total=80 * GIB,
    memory_used=GIB // 2,
    memory_reserved=GIB // 2,
    power_limit_mw=700_000,
    power_default_limit_mw=700_000,
    power_enforced_limit_mw=690_000,
    power_max_limit_mw=700_000,
    power_usage_mw=71_234,
    pcie_gen_current=1,
    pcie_gen_max=5,
    pcie_gen_gpu_max=5,
    pcie_width_current=16,
    pcie_width_max=16,
    nvlink_total=18,
    nvlink_active=18,
    clock_event_reasons=0x1,
    sm_clock_mhz=346,
    sm_clock_max_mhz=1981,
    temperature_c=34,
    slowdown_temp_c=89,
    ecc_enabled=True,
    ecc_uncorrected_volatile=0,
    ecc_uncorrected_aggregate=2,
    ecc_corrected_volatile=5,
    retired_pages_pending=None,
    remapped_rows=RemappedRows(correctable=1, uncorrectable=0, pending=False, failure=False),
    mig_enabled=False,
    mig_pending=False,
    mig_devices=None,
    persistence_mode=True,
    compute_mode=0,
    processes=(),
)


def test_real_pynvml_without_a_driver_reports_library_not_found() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    facts = read_nvml()
    assert facts.error_kind == "library-not-found"
    assert facts.error == "NVML could not load: NVML Shared Library Not Found"
    assert facts.gpus == ()
    with PcieLinkSampler() as sampler:
        sampler.sample()
    assert sampler.peak() == {}


def test_missing_pynvml_module_is_library_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    facts = read_nvml()
    assert facts.error_kind == "library-not-found"
    assert facts.error is not None and facts.error.startswith("pynvml is not importable")


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (pynvml.NVMLError_DriverNotLoaded(), "driver-not-loaded", "Driver Not Loaded"),
        (
            pynvml.NVMLError_LibRmVersionMismatch(),
            "version-mismatch",
            "RM has detected an NVML/RM version mismatch.",
        ),
        (pynvml.NVMLError_NoPermission(), "no-permission", "Insufficient Permissions"),
        (pynvml.NVMLError_Unknown(), "other", "Unknown Error"),
    ],
)
def test_init_failures_map_to_error_kinds(error: BaseException, kind: str, message: str) -> None:
    fake = FakeNvml([h100()], init_error=error)
    facts = read_nvml(fake)
    assert facts.error_kind == kind
    assert facts.error is not None and facts.error.endswith(f": {message}")
    assert facts.gpus == () and facts.driver_version is None
    assert "nvmlShutdown" not in fake.calls  # nothing to shut down after a failed init


def test_h100_every_field_answered() -> None:
    fake = FakeNvml([h100()])
    facts = read_nvml(fake)
    assert facts == NvmlFacts(driver_version="570.124.06", cuda_driver_version=12080, gpus=(H100_FACTS,))
    assert fake.calls.count("nvmlDeviceGetNvLinkState") == pynvml.NVML_NVLINK_MAX_LINKS
    assert fake.calls[-1] == "nvmlShutdown"


def test_geforce_unsupported_fields_are_none_and_the_rest_filled() -> None:
    gpu = read_nvml(FakeNvml([geforce()])).gpus[0]
    assert gpu.error is None
    assert (gpu.brand, gpu.compute_capability) == ("geforce", (8, 9))
    assert (gpu.power_limit_mw, gpu.power_default_limit_mw, gpu.power_max_limit_mw) == (
        250_000,
        450_000,
        600_000,
    )
    assert (gpu.pcie_gen_max, gpu.pcie_gen_gpu_max, gpu.pcie_width_max) == (3, 4, 8)
    assert (gpu.memory_total, gpu.memory_used, gpu.memory_reserved) == (24 * GIB, GIB, 0)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz, gpu.temperature_c, gpu.slowdown_temp_c) == (
        2520,
        3105,
        41,
        87,
    )
    assert (gpu.persistence_mode, gpu.compute_mode, gpu.processes) == (False, 0, ())
    unsupported = (
        gpu.ecc_enabled,
        gpu.ecc_uncorrected_volatile,
        gpu.ecc_uncorrected_aggregate,
        gpu.ecc_corrected_volatile,
        gpu.retired_pages_pending,
        gpu.remapped_rows,
        gpu.mig_enabled,
        gpu.mig_pending,
        gpu.mig_devices,
        gpu.nvlink_total,
        gpu.nvlink_active,
    )
    assert unsupported == (None,) * len(unsupported)


@pytest.mark.parametrize(
    ("brand", "name"),
    [
        (pynvml.NVML_BRAND_GEFORCE_RTX, "geforce-rtx"),
        (pynvml.NVML_BRAND_NVIDIA_RTX, "nvidia-rtx"),
        (pynvml.NVML_BRAND_TESLA, "tesla"),
        (pynvml.NVML_BRAND_QUADRO, "quadro"),
        (pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING, "nvidia-cloud-gaming"),
        (99, "brand-99"),
    ],
)
def test_brand_names(brand: int, name: str) -> None:
    assert read_nvml(FakeNvml([{**geforce(), "GetBrand": brand}])).gpus[0].brand == name


def test_missing_binding_functions_and_function_not_found_are_none() -> None:
    gpu = {
        **h100(),
        "GetRemappedRows": pynvml.NVMLError_FunctionNotFound,
        "GetPowerUsage": pynvml.NVMLError_NoPermission,
    }
    fake = FakeNvml([gpu], missing={"nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlMemory_v2"})
    facts = read_nvml(fake).gpus[0]
    assert (facts.pcie_gen_gpu_max, facts.remapped_rows, facts.power_usage_mw) == (None, None, None)
    # without the v2 struct in the bindings, memory comes from v1: used includes the reservation
    assert (facts.memory_total, facts.memory_used, facts.memory_reserved) == (80 * GIB, GIB, None)
    assert facts.pcie_gen_max == 5 and facts.error is None


def test_memory_falls_back_to_v1_when_the_driver_lacks_v2() -> None:
    def memory(version: Any = None) -> Any:
        return pynvml.NVMLError_FunctionNotFound if version else MEM_V1

    gpu = read_nvml(FakeNvml([{**h100(), "GetMemoryInfo": memory}])).gpus[0]
    assert (gpu.memory_total, gpu.memory_used, gpu.memory_reserved) == (80 * GIB, GIB, None)


@pytest.mark.parametrize("how", ["missing-in-bindings", "function-not-found"])
def test_clock_event_reasons_fall_back_to_throttle_api(how: str) -> None:
    gpu = {**h100(), "GetCurrentClocksThrottleReasons": 0x44}
    if how == "function-not-found":
        fake = FakeNvml([{**gpu, "GetCurrentClocksEventReasons": pynvml.NVMLError_FunctionNotFound()}])
    else:
        fake = FakeNvml([gpu], missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    assert read_nvml(fake).gpus[0].clock_event_reasons == 0x44


def test_event_reasons_preferred_over_throttle_api() -> None:
    gpu = {**h100(), "GetCurrentClocksEventReasons": 0x4, "GetCurrentClocksThrottleReasons": 0x44}
    assert read_nvml(FakeNvml([gpu])).gpus[0].clock_event_reasons == 0x4


def test_old_bindings_returning_bytes_are_decoded() -> None:
    gpu = {
        **h100(),
        "GetName": b"Tesla V100-SXM2-16GB",
        "GetUUID": b"GPU-v100",
        "GetPciInfo": SimpleNamespace(busId=b"00000000:1A:00.0", pciDeviceId=0x1DB110DE),
    }
    facts = read_nvml(FakeNvml([gpu], system={"DriverVersion": b"470.57.02"}))
    assert facts.driver_version == "470.57.02"
    assert (facts.gpus[0].name, facts.gpus[0].uuid, facts.gpus[0].bus_id) == (
        "Tesla V100-SXM2-16GB",
        "GPU-v100",
        "00000000:1A:00.0",
    )


def test_lost_gpu_is_an_entry_not_an_abort() -> None:
    lost = {**h100(1), "GetPowerUsage": pynvml.NVMLError_GpuIsLost()}
    fake = FakeNvml([h100(0), lost, h100(2)])
    facts = read_nvml(fake)
    assert facts.gpus[0] == H100_FACTS
    assert facts.gpus[1] == GpuFacts(index=1, name="NVIDIA H100 80GB HBM3", error="GPU is lost")
    assert facts.gpus[2].error is None and facts.gpus[2].bus_id == "00000000:1A:00.0"
    assert facts.error is None
    assert fake.calls.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("answers", "name", "error"),
    [
        ({"HandleByIndex": pynvml.NVMLError_GpuIsLost()}, "unknown", "GPU is lost"),
        ({"GetName": pynvml.NVMLError_ResetRequired()}, "unknown", "GPU requires restart"),
    ],
)
def test_gpu_that_stops_answering(answers: dict[str, Any], name: str, error: str) -> None:
    facts = read_nvml(FakeNvml([h100(0), {**h100(1), **answers}]))
    assert facts.gpus[1] == GpuFacts(index=1, name=name, error=error)
    assert facts.gpus[0].error is None


@pytest.mark.parametrize(
    ("answers", "field", "error"),
    [
        ({"GetEccMode": pynvml.NVMLError_Unknown()}, "ecc_enabled", "nvmlDeviceGetEccMode: Unknown Error"),
        (
            {"GetPowerUsage": pynvml.NVMLError_InsufficientPower()},
            "power_usage_mw",
            "nvmlDeviceGetPowerUsage: Insufficient External Power",
        ),
    ],
)
def test_an_unexpected_error_costs_one_field_and_is_kept(answers: dict[str, Any], field: str, error: str) -> None:
    facts = read_nvml(FakeNvml([{**h100(0), **answers}, h100(1)]))
    failed = facts.gpus[0]
    assert failed.error is None and getattr(failed, field) is None
    assert failed.query_errors == (error,)
    assert failed.memory_total == H100_FACTS.memory_total  # the rest of the card is still read
    assert facts.gpus[1].query_errors == ()  # errors do not leak into the next GPU


def test_nvlink_counts_links_that_answer_and_those_active() -> None:
    states = {link: 1 if link < 10 else 0 for link in range(12)}
    gpu = {**h100(), "GetNvLinkState": lambda link: states.get(link, pynvml.NVMLError_NotSupported)}
    facts = read_nvml(FakeNvml([gpu])).gpus[0]
    assert (facts.nvlink_total, facts.nvlink_active) == (12, 10)


def test_mig_enabled_counts_populated_slots() -> None:
    gpu = {
        **h100(),
        "GetMigMode": [1, 0],
        "GetMaxMigDeviceCount": 7,
        "GetMigDeviceHandleByIndex": lambda slot: f"mig-{slot}" if slot < 3 else pynvml.NVMLError_NotFound,
        "GetRemappedRows": pynvml.NVMLError_NotSupported,  # with active MIG instances
    }
    facts = read_nvml(FakeNvml([gpu])).gpus[0]
    assert (facts.mig_enabled, facts.mig_pending, facts.mig_devices, facts.remapped_rows) == (
        True,
        False,
        3,
        None,
    )


def test_health_counters_pending_remap_and_retirement() -> None:
    gpu = {**h100(), "GetRemappedRows": (0, 2, 1, 0), "GetRetiredPagesPendingStatus": 1, "GetEccMode": [0, 1]}
    facts = read_nvml(FakeNvml([gpu])).gpus[0]
    assert facts.remapped_rows == RemappedRows(correctable=0, uncorrectable=2, pending=True, failure=False)
    assert (facts.retired_pages_pending, facts.ecc_enabled) == (True, False)


def test_processes_with_and_without_memory_and_names() -> None:
    procs = [SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB), SimpleNamespace(pid=77, usedGpuMemory=None)]
    fake = FakeNvml([{**h100(), "GetComputeRunningProcesses": procs}], system={"ProcessNames": {4242: "python3"}})
    assert read_nvml(fake).gpus[0].processes == (
        GpuProcess(pid=4242, used_memory=3 * GIB, name="python3"),
        GpuProcess(pid=77, used_memory=None, name=None),
    )


@pytest.mark.parametrize("error", [pynvml.NVMLError_NotSupported(), pynvml.NVMLLibraryMismatchError("old driver")])
def test_processes_none_only_when_the_query_is_unsupported(error: BaseException) -> None:
    facts = read_nvml(FakeNvml([{**h100(), "GetComputeRunningProcesses": error}])).gpus[0]
    assert facts.processes is None and facts.error is None


def test_pcie_sampler_keeps_the_peak_over_samples() -> None:
    gens, widths = iter([1, 4, 5, 3]), iter([8, 16, 16, 4])
    rising = {
        **h100(0),
        "GetCurrPcieLinkGeneration": lambda: next(gens),
        "GetCurrPcieLinkWidth": lambda: next(widths),
    }
    unsupported = {**h100(1), "GetCurrPcieLinkGeneration": pynvml.NVMLError_NotSupported}
    fake = FakeNvml([rising, unsupported])
    with PcieLinkSampler(fake) as sampler:
        for _ in range(4):
            sampler.sample()
    assert sampler.peak() == {0: (5, 16), 1: (None, 16)}
    assert fake.calls.count("nvmlInit") == 1 and fake.calls[-1] == "nvmlShutdown"


def test_pcie_sampler_survives_a_gpu_lost_mid_run() -> None:
    readings = iter([4, pynvml.NVMLError_GpuIsLost()])
    gpu = {**h100(0), "GetCurrPcieLinkGeneration": lambda: next(readings)}
    with PcieLinkSampler(FakeNvml([gpu, {"HandleByIndex": pynvml.NVMLError_GpuIsLost()}])) as sampler:
        sampler.sample()
        sampler.sample()
    assert sampler.peak() == {0: (4, 16)}


@pytest.mark.parametrize("nvml", [FakeNvml([h100()], init_error=pynvml.NVMLError_DriverNotLoaded()), None])
def test_pcie_sampler_is_inert_without_nvml(nvml: FakeNvml | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with PcieLinkSampler(nvml) as sampler:
        sampler.sample()
    assert sampler.peak() == {}
    assert nvml is None or "nvmlShutdown" not in nvml.calls


def test_one_handle_per_gpu_that_answers_and_none_when_the_count_fails() -> None:
    fake = FakeNvml([h100(0), {"HandleByIndex": pynvml.NVMLError_GpuIsLost()}, h100(2)])
    assert sorted(Query(fake).handles()) == [0, 2]

    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError_GpuIsLost()

    assert Query(NoCount([h100(0)])).handles() == {}


@pytest.mark.parametrize(
    ("nvml", "torch"),
    [("GPU-5d0a8c1e-aa", "5d0a8c1e-aa"), ("GPU-5D0A8C1E-AA", "gpu-5d0a8c1e-aa"), ("GPU-abc", " GPU-ABC\n")],
)
def test_uuid_key_is_one_rule_for_nvml_and_torch_spellings(nvml: str, torch: str) -> None:
    assert uuid_key(nvml) == uuid_key(torch)


def test_uuid_key_keeps_different_gpus_apart() -> None:
    assert uuid_key("GPU-abc-0") != uuid_key("GPU-abc-1") and uuid_key("MIG-abc") != uuid_key("abc")
