"""A pynvml stand-in for the NVML adapter's tests: each GPU is a dict of answers (``h100()``, ``geforce()``).

It re-exports the real ``pynvml`` exception classes and constants, so the adapter's error mapping is exercised
with what nvidia-ml-py really raises; only the functions are replaced, and every call is checked against the
real function's signature. Pass it to ``read_nvml(nvml=...)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1 << 30
SM, GRAPHICS, MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_MEM
UNCORRECTED, CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
VOLATILE, AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


class FakeNvml:
    """A pynvml stand-in: real constants and exception classes; each GPU is a dict of answers.

    A GPU dict maps a device function without its ``nvmlDevice`` prefix (``"GetPowerUsage"``) to its answer: a
    value, an exception class or instance to raise, or a callable taking the arguments after the handle (whose
    result may itself be an exception). Functions a GPU does not describe raise NotSupported; names in
    ``missing`` do not exist at all (bindings too old to have them). Every device call is checked against the
    real pynvml function's name and signature, so the fake cannot accept a call the real bindings would not.
    """

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        *,
        init_error: BaseException | None = None,
        system: dict[str, Any] | None = None,
        missing: Iterable[str] = (),
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.system = {"DriverVersion": "570.124.06", "CudaDriverVersion": 12080, **(system or {})}
        self.missing = set(missing)
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlMemory_v")) and name not in self.missing:
            return getattr(pynvml, name)
        if name.startswith("nvmlDevice") and name not in self.missing:
            return lambda handle, *args, **kwargs: self._device(handle, name, args, kwargs)
        raise AttributeError(name)

    def _device(self, handle: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inspect.signature(getattr(pynvml, name)).bind(handle, *args, **kwargs)  # AttributeError / TypeError
        self.calls.append(name)
        answer = self.gpus[handle].get(name.removeprefix("nvmlDevice"), pynvml.NVMLError_NotSupported)
        if callable(answer) and not _is_error(answer):
            answer = answer(*args, **kwargs)
        if _is_error(answer):
            raise answer
        return answer

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> Any:
        return self.system["DriverVersion"]

    def nvmlSystemGetCudaDriverVersion(self) -> Any:
        return self.system["CudaDriverVersion"]

    def nvmlSystemGetProcessName(self, pid: int) -> Any:
        names = self.system.get("ProcessNames", {})
        if pid not in names:
            raise pynvml.NVMLError_NotFound()
        return names[pid]

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        answer = self.gpus[index].get("HandleByIndex", index)
        if _is_error(answer):
            raise answer
        return int(answer)


def _is_error(answer: Any) -> bool:
    return isinstance(answer, BaseException) or (isinstance(answer, type) and issubclass(answer, BaseException))


MEM_V2 = SimpleNamespace(total=80 * GIB, reserved=GIB // 2, free=79 * GIB, used=GIB // 2)
MEM_V1 = SimpleNamespace(total=80 * GIB, free=79 * GIB, used=GIB)


def h100(index: int = 0) -> dict[str, Any]:
    """An H100 SXM with every query answered, 18 of 18 NVLinks up, idle, PCIe link down-trained."""
    return {
        "GetName": "NVIDIA H100 80GB HBM3",
        "GetUUID": f"GPU-5d0a8c1e-0000-0000-0000-00000000000{index}",
        "GetPciInfo": SimpleNamespace(busId=f"00000000:{0x18 + index:02X}:00.0", pciDeviceId=0x233010DE),
        "GetBrand": pynvml.NVML_BRAND_NVIDIA,
        "GetCudaComputeCapability": (9, 0),
        "GetMemoryInfo": lambda version=None: MEM_V2 if version == pynvml.nvmlMemory_v2 else MEM_V1,
        "GetPowerManagementLimit": 700_000,
        "GetPowerManagementDefaultLimit": 700_000,
        "GetEnforcedPowerLimit": 690_000,
        "GetPowerManagementLimitConstraints": [200_000, 700_000],
        "GetPowerUsage": 71_234,
        "GetCurrPcieLinkGeneration": 1,
        "GetMaxPcieLinkGeneration": 5,
        "GetGpuMaxPcieLinkGeneration": 5,
        "GetCurrPcieLinkWidth": 16,
        "GetMaxPcieLinkWidth": 16,
        "GetNvLinkState": lambda link: 1 if link < 18 else pynvml.NVMLError_InvalidArgument,
        "GetCurrentClocksEventReasons": 0x1,
        "GetClockInfo": lambda clock: {GRAPHICS: 345, SM: 346, MEM: 2619}[clock],
        "GetMaxClockInfo": lambda clock: {GRAPHICS: 1980, SM: 1981, MEM: 2619}[clock],
        "GetTemperature": lambda sensor: {pynvml.NVML_TEMPERATURE_GPU: 34}[sensor],
        "GetTemperatureThreshold": lambda kind: {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
        }[kind],
        "GetEccMode": [1, 1],
        "GetTotalEccErrors": lambda kind, counter: {
            (UNCORRECTED, VOLATILE): 0,
            (UNCORRECTED, AGGREGATE): 2,
            (CORRECTED, VOLATILE): 5,
            (CORRECTED, AGGREGATE): 50,
        }[(kind, counter)],
        "GetRetiredPagesPendingStatus": pynvml.NVMLError_NotSupported,  # Hopper remaps rows instead
        "GetRemappedRows": (1, 0, 0, 0),
        "GetMigMode": [0, 0],
        "GetPersistenceMode": 1,
        "GetComputeMode": 0,
        "GetComputeRunningProcesses": [],
    }


def geforce() -> dict[str, Any]:
    """A power-capped 4090: no ECC, no row remapper, no MIG, no NVLink; everything else answers."""
    return {
        "GetName": "NVIDIA GeForce RTX 4090",
        "GetUUID": "GPU-4090",
        "GetPciInfo": SimpleNamespace(busId="00000000:01:00.0", pciDeviceId=0x268410DE),
        "GetBrand": pynvml.NVML_BRAND_GEFORCE,
        "GetCudaComputeCapability": (8, 9),
        "GetMemoryInfo": lambda version=None: SimpleNamespace(total=24 * GIB, free=23 * GIB, used=GIB, reserved=0),
        "GetPowerManagementLimit": 250_000,
        "GetPowerManagementDefaultLimit": 450_000,
        "GetEnforcedPowerLimit": 250_000,
        "GetPowerManagementLimitConstraints": [150_000, 600_000],
        "GetPowerUsage": 21_000,
        "GetCurrPcieLinkGeneration": 4,
        "GetMaxPcieLinkGeneration": 3,
        "GetGpuMaxPcieLinkGeneration": 4,
        "GetCurrPcieLinkWidth": 8,
        "GetMaxPcieLinkWidth": 8,
        "GetCurrentClocksEventReasons": 0x4,
        "GetClockInfo": lambda clock: {SM: 2520}[clock],
        "GetMaxClockInfo": lambda clock: {SM: 3105}[clock],
        "GetTemperature": lambda sensor: 41,
        "GetTemperatureThreshold": lambda kind: 87,
        "GetPersistenceMode": 0,
        "GetComputeMode": 0,
        "GetComputeRunningProcesses": [],
    }
