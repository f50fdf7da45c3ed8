"""NVML adapter: the only module that imports ``pynvml`` (package nvidia-ml-py); it turns NVML into facts.

Every getter goes through ``Query`` (in the spirit of nvitop's ``nvmlQuery``). "Not answered here"
(NotSupported, FunctionNotFound, NoPermission, ...; or an ``AttributeError`` from bindings too old to have the
function) makes the field ``None``. GpuIsLost / ResetRequired mean the GPU stopped answering: it becomes
``GpuFacts(index, name, error=...)`` and the next GPU is read. Any other NVML error (Unknown, InsufficientPower,
...) leaves that field ``None`` and is kept in ``GpuFacts.query_errors`` for the inventory check to show.
Units are NVML's (bytes, mW, MHz, °C). Exception classes and constants come from the module passed in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from itertools import combinations
from typing import Any

from checks.facts import GpuFacts, GpuLocality, GpuPair, GpuProcess, NvmlFacts, RemappedRows, TopologyFacts

# Errors meaning "this field is not answered on this GPU / driver / binding": the field becomes None.
# NotFound: empty MIG slots and unresolvable PIDs; ArgumentVersionMismatch: a driver too old for a
# versioned struct (nvmlMemory_v2); NVMLLibraryMismatchError: nvidia-ml-py (13.615.71) re-raises
# FunctionNotFound of unversioned process queries as this (not an NVMLError subclass).
_ABSENT_ERRORS = (
    "NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission", "NVMLError_InvalidArgument",
    "NVMLError_NotFound", "NVMLError_NoData", "NVMLError_ArgumentVersionMismatch", "NVMLError_Deprecated",
    "NVMLLibraryMismatchError",
)  # fmt: skip
# Errors that say the GPU itself is gone: reported by their own message, without the function name. Any other
# NVML error leaves that one field None and is kept in GpuFacts.query_errors ("Unknown Error" from one query on
# a vGPU must not hide every other fact of the card; "Insufficient External Power" must still be seen).
_GPU_GONE_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired")

# nvmlInit() failure class -> (error_kind, the sentence that starts NvmlFacts.error).
_INIT_ERRORS = {
    "NVMLError_LibraryNotFound": ("library-not-found", "NVML could not load"),
    "NVMLError_DriverNotLoaded": ("driver-not-loaded", "NVML found no loaded NVIDIA kernel driver"),
    "NVMLError_LibRmVersionMismatch": ("version-mismatch", "NVML and kernel driver versions differ"),
    "NVMLError_NoPermission": ("no-permission", "NVML was denied access to the GPUs"),
}

# NVML_BRAND_<NAME> suffixes, kebab-cased for GpuFacts.brand. CLOUD_GAMING precedes its alias VGAMING (both 11).
_BRANDS = (
    "UNKNOWN", "QUADRO", "TESLA", "NVS", "GRID", "GEFORCE", "TITAN", "NVIDIA_VAPPS", "NVIDIA_VPC", "NVIDIA_VCS",
    "NVIDIA_VWS", "NVIDIA_CLOUD_GAMING", "NVIDIA_VGAMING", "QUADRO_RTX", "NVIDIA_RTX", "NVIDIA", "GEFORCE_RTX",
    "TITAN_RTX", "NVIDIA_DLA", "NVIDIA_VGAMEDEV", "NVIDIA_NPU",
)  # fmt: skip

_ENABLED = 1  # NVML_FEATURE_ENABLED, NVML_DEVICE_MIG_ENABLE, nvlinkState "active"


class Unanswered(Exception):
    """An NVML call failed in a way that is not "unsupported": the GPU (or NVML) stopped answering."""


def _error_classes(nvml: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    """Return the exception classes of ``nvml`` among ``names`` (old bindings lack some)."""
    return tuple(cls for cls in (getattr(nvml, name, None) for name in names) if isinstance(cls, type))


def _text(value: Any) -> Any:
    """Decode ``bytes`` (nvidia-ml-py < 11.5xx returned bytes from string getters); pass anything else."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Query:
    """The one wrapper around every NVML getter."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        # AttributeError: bindings too old to have the function (or the struct version) at all.
        self._absent: tuple[type[BaseException], ...] = (*_error_classes(nvml, _ABSENT_ERRORS), AttributeError)
        self._gone = _error_classes(nvml, _GPU_GONE_ERRORS)
        self.errors: list[str] = []  # unexpected failures since the last reset, "function: message"

    def __call__(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``nvml.<function>``: None when not answered (unexpected errors are also kept in ``errors``);
        ``Unanswered`` when the GPU is gone."""
        try:
            return _text(getattr(self.nvml, function)(*args, **kwargs))
        except self._absent:
            return None
        except self.nvml.NVMLError as exc:
            if isinstance(exc, self._gone):
                raise Unanswered(str(exc)) from exc
            self.errors.append(f"{function}: {exc}")
            return None

    def handle(self, index: int) -> Any:
        """Return the device handle of GPU ``index``, raising ``Unanswered`` when there is none."""
        handle = self("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            raise Unanswered("; ".join(self.errors) or f"NVML gave no handle for GPU {index}")
        return handle

    def handles(self) -> dict[int, Any]:
        """Return a handle per GPU that has one, by NVML index; GPUs already lost (or no count) are left out."""
        found: dict[int, Any] = {}
        with contextlib.suppress(Unanswered):
            for index in range(self("nvmlDeviceGetCount") or 0):
                with contextlib.suppress(Unanswered):
                    found[index] = self.handle(index)
        return found


def uuid_key(uuid: str) -> str:
    """The one rule for matching a GPU's UUID between NVML and torch: case-blind, without NVML's ``GPU-`` prefix
    (NVML says ``GPU-5d0a...``; torch >= 2.1 prints the same UUID bare)."""
    return uuid.strip().lower().removeprefix("gpu-")


def start_nvml(nvml: Any | None) -> tuple[Any, NvmlFacts | None]:
    """Import (when ``nvml`` is None) and initialise NVML; on failure return the facts that say why."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            error = f"pynvml is not importable (install nvidia-ml-py): {exc}"
            return None, NvmlFacts(error=error, error_kind="library-not-found")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return None, _init_failure(nvml, exc)
    return nvml, None


def _init_failure(nvml: Any, exc: BaseException) -> NvmlFacts:
    """Map an ``nvmlInit()`` exception to NvmlFacts with a sentence and an ``error_kind``."""
    for name, (kind, sentence) in _INIT_ERRORS.items():
        cls = getattr(nvml, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return NvmlFacts(error=f"{sentence}: {exc}", error_kind=kind)
    return NvmlFacts(error=f"NVML failed to initialise: {exc}", error_kind="other")


def stop_nvml(nvml: Any) -> None:
    """Shut NVML down; a failing shutdown changes nothing about what was read."""
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


def read_nvml(nvml: Any | None = None) -> NvmlFacts:
    """Read the driver and every GPU through NVML; a missing library or driver is data, not an exception.

    Command line equivalent: nvidia-smi -q
    """
    nvml, failure = start_nvml(nvml)
    if failure is not None:
        return failure
    try:
        return _read_system(Query(nvml))
    finally:
        stop_nvml(nvml)


def _read_system(q: Query) -> NvmlFacts:
    """Read driver version, CUDA driver version and each GPU (nvidia-smi's header line and its table)."""
    try:
        driver, cuda = q("nvmlSystemGetDriverVersion"), q("nvmlSystemGetCudaDriverVersion")
        count = q("nvmlDeviceGetCount")
        if count is None:
            raise Unanswered("; ".join(q.errors) or "nvmlDeviceGetCount: no answer")
    except Unanswered as exc:
        return NvmlFacts(error=f"NVML started but could not list the GPUs: {exc}", error_kind="other")
    gpus = tuple(_read_gpu(q, index) for index in range(count))
    return NvmlFacts(driver_version=driver, cuda_driver_version=cuda, gpus=gpus)


def _read_gpu(q: Query, index: int) -> GpuFacts:
    """Read one GPU; if it stops answering, return only its index, name (when known) and the error."""
    name = "unknown"
    q.errors.clear()
    try:
        handle = q.handle(index)
        name = q("nvmlDeviceGetName", handle) or name
        fields: dict[str, Any] = {}
        for section in _SECTIONS:
            fields.update(section(q, handle))
        return GpuFacts(index=index, name=name, query_errors=tuple(q.errors), **fields)
    except Unanswered as exc:
        return GpuFacts(index=index, name=name, error=str(exc))


def _brand(nvml: Any, value: int) -> str:
    """Name an NVML_BRAND_* value: "geforce", "geforce-rtx", "nvidia", ...; "brand-<n>" when unknown."""
    for suffix in _BRANDS:
        if getattr(nvml, f"NVML_BRAND_{suffix}", None) == value:
            return suffix.lower().replace("_", "-")
    return f"brand-{value}"


def _identity(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=uuid,pci.bus_id,pci.device_id,compute_cap (brand: nvidia-smi -q "Product Brand")."""
    pci = q("nvmlDeviceGetPciInfo", handle)
    brand = q("nvmlDeviceGetBrand", handle)
    capability = q("nvmlDeviceGetCudaComputeCapability", handle)
    return {
        "uuid": q("nvmlDeviceGetUUID", handle),
        "bus_id": None if pci is None else _text(pci.busId),
        "pci_device_id": None if pci is None else int(pci.pciDeviceId),
        "brand": None if brand is None else _brand(q.nvml, brand),
        "compute_capability": None if capability is None else (int(capability[0]), int(capability[1])),
    }


def _memory(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=memory.total,memory.used,memory.reserved (v2 struct; v1 lacks ``reserved``)."""
    version = getattr(q.nvml, "nvmlMemory_v2", None)
    info = None if version is None else q("nvmlDeviceGetMemoryInfo", handle, version=version)
    if info is not None:
        return {"memory_total": info.total, "memory_used": info.used, "memory_reserved": info.reserved}
    info = q("nvmlDeviceGetMemoryInfo", handle)
    return {} if info is None else {"memory_total": info.total, "memory_used": info.used}


def _power(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=power.limit,power.default_limit,enforced.power.limit,power.max_limit,power.draw"""
    constraints = q("nvmlDeviceGetPowerManagementLimitConstraints", handle)  # [min, max]
    return {
        "power_limit_mw": q("nvmlDeviceGetPowerManagementLimit", handle),
        "power_default_limit_mw": q("nvmlDeviceGetPowerManagementDefaultLimit", handle),
        "power_enforced_limit_mw": q("nvmlDeviceGetEnforcedPowerLimit", handle),
        "power_max_limit_mw": None if constraints is None else constraints[1],
        "power_usage_mw": q("nvmlDeviceGetPowerUsage", handle),
    }


def _pcie(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.gen.gpumax,
    pcie.link.width.current,pcie.link.width.max (at idle the current link is down-trained)."""
    return {
        "pcie_gen_current": q("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": q("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_gen_gpu_max": q("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),
        "pcie_width_current": q("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": q("nvmlDeviceGetMaxPcieLinkWidth", handle),
    }


def _nvlink(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi nvlink --status: links that answer a state exist; state 1 is active."""
    links = range(q.nvml.NVML_NVLINK_MAX_LINKS)
    states = [state for link in links if (state := q("nvmlDeviceGetNvLinkState", handle, link)) is not None]
    if not states:
        return {}
    return {"nvlink_total": len(states), "nvlink_active": sum(state == _ENABLED for state in states)}


def _clocks(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=clocks_event_reasons.active,clocks.sm,clocks.max.sm,temperature.gpu
    (slowdown threshold: nvidia-smi -q -d TEMPERATURE "GPU Slowdown Temp")."""
    nvml, slowdown = q.nvml, q.nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    # The Throttle names are deprecated in nvidia-ml-py 13.x; drivers before 535 only have them.
    reasons = q("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = q("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return {
        "clock_event_reasons": reasons,
        "sm_clock_mhz": q("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": q("nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
        "temperature_c": q("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
        "slowdown_temp_c": q("nvmlDeviceGetTemperatureThreshold", handle, slowdown),
    }


def _ecc(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=ecc.mode.current,ecc.errors.uncorrected.volatile.total,
    ecc.errors.uncorrected.aggregate.total,ecc.errors.corrected.volatile.total"""
    nvml = q.nvml
    mode = q("nvmlDeviceGetEccMode", handle)  # [current, pending]

    def total(error_type: int, counter: int) -> Any:
        return q("nvmlDeviceGetTotalEccErrors", handle, error_type, counter)

    return {
        "ecc_enabled": None if mode is None else mode[0] == _ENABLED,
        "ecc_uncorrected_volatile": total(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": total(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC),
        "ecc_corrected_volatile": total(nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC),
    }


def _memory_health(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=retired_pages.pending and nvidia-smi -q -d ROW_REMAPPER."""
    pending = q("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    rows = q("nvmlDeviceGetRemappedRows", handle)  # (correctable, uncorrectable, pending, failure)
    remapped = None if rows is None else RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3]))
    return {"retired_pages_pending": None if pending is None else bool(pending), "remapped_rows": remapped}


def _mig(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending; nvidia-smi -L lists the MIG devices."""
    mode = q("nvmlDeviceGetMigMode", handle)  # [current, pending]
    if mode is None:
        return {}
    facts: dict[str, Any] = {"mig_enabled": mode[0] == _ENABLED, "mig_pending": mode[1] == _ENABLED}
    slots = q("nvmlDeviceGetMaxMigDeviceCount", handle) if facts["mig_enabled"] else None
    if slots is not None:
        handles = (q("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot) for slot in range(slots))
        facts["mig_devices"] = sum(mig is not None for mig in handles)
    return facts


def _modes(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-gpu=persistence_mode,compute_mode"""
    persistence = q("nvmlDeviceGetPersistenceMode", handle)
    return {
        "persistence_mode": None if persistence is None else persistence == _ENABLED,
        "compute_mode": q("nvmlDeviceGetComputeMode", handle),
    }


def _processes(q: Query, handle: Any) -> dict[str, Any]:
    """nvidia-smi --query-compute-apps=pid,process_name,used_memory (host PIDs; names may not resolve)."""
    found = q("nvmlDeviceGetComputeRunningProcesses", handle)
    if found is None:
        return {}
    name = "nvmlSystemGetProcessName"
    return {"processes": tuple(GpuProcess(p.pid, p.usedGpuMemory, q(name, p.pid)) for p in found)}


_SECTIONS: tuple[Callable[[Query, Any], dict[str, Any]], ...] = (
    _identity, _memory, _power, _pcie, _nvlink, _clocks, _ecc, _memory_health, _mig, _modes, _processes,
)  # fmt: skip


def _higher(seen: int | None, now: int | None) -> int | None:
    """Return the larger of two optional readings."""
    return max((reading for reading in (seen, now) if reading is not None), default=None)


class PcieLinkSampler:
    """Context manager: init NVML once, sample() reads current gen/width for every GPU, peak() returns the best seen.

    Idle links down-train, so sample while a host-to-device copy runs elsewhere. Without NVML the sampler is
    inert (peak() is ``{}``); it never raises. Command line equivalent:
    nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.width.current --format=csv -lms 100
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._query: Query | None = None
        self._handles: dict[int, Any] = {}
        self._peak: dict[int, tuple[int | None, int | None]] = {}

    def __enter__(self) -> PcieLinkSampler:
        nvml, failure = start_nvml(self._nvml)
        if failure is None:
            self._query = Query(nvml)
            self._handles = self._query.handles()
            self._peak = {index: (None, None) for index in self._handles}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._query is not None:
            stop_nvml(self._query.nvml)
            self._query = None

    def sample(self) -> None:
        """Read the current link generation and width of every GPU and keep the highest of each."""
        q = self._query
        if q is None:
            return
        q.errors.clear()  # sampling keeps no per-query history
        for index, handle in self._handles.items():
            try:
                gen = q("nvmlDeviceGetCurrPcieLinkGeneration", handle)
                width = q("nvmlDeviceGetCurrPcieLinkWidth", handle)
            except Unanswered:
                continue  # a GPU lost mid-run keeps what it showed before
            best_gen, best_width = self._peak[index]
            self._peak[index] = (_higher(best_gen, gen), _higher(best_width, width))

    def peak(self) -> dict[int, tuple[int | None, int | None]]:
        """Return GPU index -> (highest generation seen, highest width seen); None where never answered."""
        return dict(self._peak)


# --- topology (docs/sources.md#nvml-topology) ------------------------------------------------------------------

# NVML_P2P_STATUS_* value -> nvidia-smi topo -p2p letter (docs/sources.md#nvml-topology).
P2P_LETTERS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
# NVML_P2P_CAPS_INDEX_*: READ is the tuple (0,) in nvidia-ml-py 13.615.71 (a stray comma) and ctypes refuses it,
# so the integers are spelled out here (docs/sources.md#pynvml-p2p-index).
_P2P_INDICES = {"p2p_read": 0, "p2p_write": 1, "p2p_nvlink": 2, "p2p_atomics": 3}
_NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_MASK_BITS = 64  # CPU and node masks come as c_ulonglong words


def read_topology(nvml: Any | None = None, cpu_count: int | None = None) -> TopologyFacts:
    """Read every GPU's NUMA node, local CPUs and NVLink ends, and every pair's path and P2P status.

    Command line equivalent: nvidia-smi topo -m; nvidia-smi topo -p2p rwan
    """
    nvml, failure = start_nvml(nvml)
    if failure is not None:
        return TopologyFacts(error=failure.error)
    try:
        return _read_topology(Query(nvml), cpu_count or os.cpu_count() or 1)
    finally:
        stop_nvml(nvml)


def _read_topology(q: Query, cpu_count: int) -> TopologyFacts:
    handles = q.handles()
    gpus = {i: _locality(q, i, h, cpu_count) for i, h in handles.items()}
    pairs = tuple(_pair(q, gpus[a], gpus[b], handles[a], handles[b]) for a, b in combinations(sorted(handles), 2))
    return TopologyFacts(gpus=tuple(gpus.values()), pairs=pairs)


def _bits(mask: Any) -> tuple[int, ...]:
    """The set bits of an NVML mask (ctypes array of 64-bit words), lowest first."""
    return tuple(w * _MASK_BITS + b for w, word in enumerate(mask) for b in range(_MASK_BITS) if int(word) >> b & 1)


def _numa_node(q: Query, handle: Any) -> int | None:
    """The NUMA node nearest the GPU: its memory affinity on x86; nvmlDeviceGetNumaNodeId where the GPU is a
    node itself (Grace). docs/sources.md#nvml-numa."""
    nodes = q("nvmlDeviceGetMemoryAffinity", handle, 4, q.nvml.NVML_AFFINITY_SCOPE_NODE)
    found = _bits(nodes) if nodes is not None else ()
    if len(found) == 1:
        return found[0]
    node = q("nvmlDeviceGetNumaNodeId", handle)
    return int(node) if node is not None else None


def _locality(q: Query, index: int, handle: Any, cpu_count: int) -> GpuLocality:
    """nvidia-smi topo -m's "CPU Affinity" and "NUMA Affinity" columns, and nvidia-smi nvlink -R."""
    try:
        pci = q("nvmlDeviceGetPciInfo", handle)
        cpus = q("nvmlDeviceGetCpuAffinity", handle, (cpu_count + _MASK_BITS - 1) // _MASK_BITS)
        peers, switch = [], 0
        for link in range(q.nvml.NVML_NVLINK_MAX_LINKS):
            if q("nvmlDeviceGetNvLinkState", handle, link) != _ENABLED:
                continue
            if q("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link) == _NVLINK_SWITCH:
                switch += 1
            elif (remote := q("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)) is not None:
                peers.append(_text(remote.busId))
        return GpuLocality(
            index=index,
            bus_id=None if pci is None else _text(pci.busId),
            numa_node=_numa_node(q, handle),
            cpus=() if cpus is None else _bits(cpus),
            nvlink_peers=tuple(peers),
            nvlink_switch_links=switch,
        )
    except Unanswered:
        return GpuLocality(index=index)


def _pair(q: Query, a: GpuLocality, b: GpuLocality, ha: Any, hb: Any) -> GpuPair:
    """One cell of nvidia-smi topo -m and of topo -p2p: NV# counts the links whose far end is the peer
    [derived, docs/sources.md#nvml-topology], or through NVSwitches the fewer of the two GPUs' links."""
    direct = sum(peer == b.bus_id for peer in a.nvlink_peers) if b.bus_id else 0
    switched = min(a.nvlink_switch_links, b.nvlink_switch_links)
    try:
        level = q("nvmlDeviceGetTopologyCommonAncestor", ha, hb)
        status = {name: q("nvmlDeviceGetP2PStatus", ha, hb, idx) for name, idx in _P2P_INDICES.items()}
    except Unanswered:
        level, status = None, {}
    letters = {name: None if v is None else P2P_LETTERS.get(int(v), f"status-{v}") for name, v in status.items()}
    return GpuPair(a=a.index, b=b.index, level=level, nvlinks=direct or switched, **letters)
