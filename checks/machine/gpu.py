"""Per-GPU hardware state through NVML: power cap, PCIe link, NVLink, throttling, ECC, MIG, other tenants.

Units: NVML milliwatts, bytes, MHz (docs/sources.md#nvml-api). A field that is ``None`` was not supported on the
card (consumer boards answer NotSupported for ECC, MIG, NVLink): that is "n/a", never a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from checks.config import PreflightConfig
from checks.facts import GpuFacts, MachineFacts
from checks.machine.grading import grade, graded
from checks.result import Result, Status, fail, ok, skip, warn
from checks.tables import datasheet
from checks.tables.datasheet import PCIE_X16_GB_S
from checks.units import GIB

# Clock event reason bits (nvmlClocksEventReason*, docs/sources.md#nvml-api). Idle (0x1), application clocks
# (0x2), sync boost (0x10) and display (0x100) are not problems and are ignored.
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
_REASONS = {
    HW_SLOWDOWN: ("hardware slowdown", Status.FAIL),
    HW_THERMAL: ("hardware thermal slowdown", Status.FAIL),
    HW_POWER_BRAKE: ("hardware power brake", Status.FAIL),
    SW_THERMAL: ("software thermal slowdown", Status.WARN),
    SW_POWER_CAP: ("software power cap", Status.WARN),
}

GpuJudge = Callable[[GpuFacts, PreflightConfig], Result]


def _per_gpu(check_id: str, m: MachineFacts, cfg: PreflightConfig, judge: GpuJudge) -> list[Result]:
    """Apply ``judge`` to every answering GPU; no driver or no GPU gives one skip."""
    if m.nvml.error or not m.nvml.gpus:
        return [skip(check_id, "no NVIDIA GPU visible (see driver)")]
    results = [judge(g, cfg) for g in m.nvml.gpus if g.error is None]
    return results or [skip(check_id, "no GPU answered (see gpu-inventory)")]


def _sub(g: GpuFacts) -> str:
    return f"gpu{g.index}"


def gpu_inventory(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Every GPU answers NVML; name, memory and compute capability.

    Command line equivalent: nvidia-smi -L.
    """
    if m.nvml.error or not m.nvml.gpus:
        return [skip("gpu-inventory", "no NVIDIA GPU visible (see driver)")]
    return [_inventory_one(g) for g in m.nvml.gpus]


def _inventory_one(g: GpuFacts) -> Result:
    if g.error:
        hint = (
            "the GPU stopped answering (Xid 79 'fallen off the bus' or lost): reset or ask the provider for another box"
        )
        return fail("gpu-inventory", f"{g.name}: {g.error}", hint, subject=_sub(g), value=g.bus_id)
    cc = f"sm_{g.compute_capability[0]}{g.compute_capability[1]}" if g.compute_capability else "sm_?"
    mem = f"{g.memory_total / GIB:.0f} GiB" if g.memory_total else "memory ?"
    spec = datasheet.lookup(g.name)
    known = f" [{spec.model}]" if spec else " [not in the datasheet table: no expected figures]"
    bus = f", bus {g.bus_id}" if g.bus_id else ""
    summary = f"{g.name}, {mem}, {cc}{bus}{known}"
    if any("Insufficient External Power" in e for e in g.query_errors):
        return fail(
            "gpu-inventory",
            summary + "; NVML: insufficient external power",
            "a power cable of the card is not connected: ask the provider to fix it",
            value=g.name,
            subject=_sub(g),
        )
    if g.query_errors:
        return warn(
            "gpu-inventory",
            summary + "; some NVML queries failed: " + "; ".join(g.query_errors),
            "those facts are unknown (checks that need them skip); a driver/nvidia-ml-py mismatch or vGPU limits",
            value=g.name,
            subject=_sub(g),
        )
    return ok("gpu-inventory", summary, value=g.name, subject=_sub(g))


def gpu_power(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Power limit is the card's default (a capped 4090 runs ~20% slower).

    Command line equivalent: nvidia-smi --query-gpu=power.limit,enforced.power.limit,power.default_limit --format=csv
    """
    return _per_gpu("gpu-power", m, cfg, _power_one)


def _power_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    limit = g.power_enforced_limit_mw or g.power_limit_mw
    default = g.power_default_limit_mw
    if not limit or not default:
        return skip("gpu-power", "power limits not readable on this card", subject=_sub(g))
    frac, need = limit / default, cfg.gpu.power_min_fraction * default / 1000
    summary = f"power limit {limit / 1000:.0f} W is {frac:.0%} of the default {default / 1000:.0f} W"
    kw = {"value": round(limit / 1000, 1), "expected": f">= {need:.0f} W", "subject": _sub(g)}
    hint = (
        f"the card is capped: `nvidia-smi -i {g.index} -pl {default / 1000:.0f}` as root on the host; on a "
        "rented box ask the provider or pick another offer (expect ~10-20% lower throughput)"
    )
    return graded("gpu-power", grade(frac, cfg.gpu.power_min_fraction), summary, hint, **kw)


def _link_rate(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in PCIE_X16_GB_S:
        return None
    return PCIE_X16_GB_S[gen] * width / 16


def gpu_pcie(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """PCIe link under load vs what the GPU supports (idle links down-train, so idle values are not judged).

    Command line equivalent: nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
    """
    return _per_gpu("gpu-pcie", m, cfg, _pcie_one)


def _pcie_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    spec = datasheet.lookup(g.name)
    gpu_gen = g.pcie_gen_gpu_max or (spec.pcie_gen if spec else None)
    gpu_width = spec.pcie_width if spec else 16
    full = _link_rate(gpu_gen, gpu_width)
    loaded = bool(g.pcie_gen_loaded and g.pcie_width_loaded)
    gen = g.pcie_gen_loaded if loaded else g.pcie_gen_max
    width = g.pcie_width_loaded if loaded else g.pcie_width_max
    how = "under load" if loaded else "slot capability (not measured under load)"
    have = _link_rate(gen, width)
    if full is None or have is None:
        return skip("gpu-pcie", "PCIe link not readable on this card (vGPU or unsupported)", subject=_sub(g))
    frac = have / full
    summary = f"Gen{gen} x{width} {how}, GPU supports Gen{gpu_gen} x{gpu_width} ({frac:.0%} of its link bandwidth)"
    kw = {"value": f"Gen{gen} x{width}", "expected": f"Gen{gpu_gen} x{gpu_width}", "subject": _sub(g)}
    slot = _slot_limit(g, gpu_gen, gpu_width)
    if slot:
        summary += f"; the slot tops out at {slot}"
    status = grade(frac, 1.0, cfg.gpu.pcie_fail_fraction)  # anything under the GPU's own link is a warn
    return graded("gpu-pcie", status, summary, _pcie_hint(g, slot, gpu_gen, gpu_width), **kw)


def _slot_limit(g: GpuFacts, gpu_gen: int | None, gpu_width: int) -> str:
    """What the slot (NVML's device-and-system maximum) offers below the card: "Gen3", "x8", "Gen3 x8" or ""."""
    parts = []
    if g.pcie_gen_max and gpu_gen and g.pcie_gen_max < gpu_gen:
        parts.append(f"Gen{g.pcie_gen_max}")
    if g.pcie_width_max and g.pcie_width_max < gpu_width:
        parts.append(f"x{g.pcie_width_max}")
    return " ".join(parts)


def _pcie_hint(g: GpuFacts, slot: str, gpu_gen: int | None, gpu_width: int) -> str:
    """Blame what the facts point at: the platform when the slot itself tops out below the card, else the link."""
    slower = "host<->GPU copies run slower"
    if g.pcie_gen_max and gpu_gen and g.pcie_gen_max < gpu_gen:
        lanes = " and gives it fewer lanes" if "x" in slot else ""
        return (
            f"the platform limits the link: this slot/CPU tops out at Gen{g.pcie_gen_max}{lanes} (the card does "
            f"Gen{gpu_gen} x{gpu_width}); nothing on this box raises it: {slower}; pick a box whose platform supports "
            f"Gen{gpu_gen}, or accept the slower copies"
        )
    if slot:
        return (
            f"the slot gives the card {slot} lanes of its x{gpu_width} (an x{g.pcie_width_max} slot, a riser or "
            f"bifurcation): {slower}; ask the provider for a full x{gpu_width} slot or pick another box"
        )
    return (
        "the link trained below what slot and card both support (a riser, a badly seated card or a BIOS "
        f"link-speed setting): {slower}; ask the provider to reseat it or pick another box"
    )


def gpu_nvlink(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """All NVLink links of an SXM part are active; a PCIe board's bridge is absent or whole.

    Command line equivalent: nvidia-smi nvlink --status.
    """
    alone = len(m.nvml.gpus) == 1
    return _per_gpu("gpu-nvlink", m, cfg, lambda g, _: _nvlink_one(g, m.host.nvswitch_count, alone))


def _nvlink_one(g: GpuFacts, nvswitches: int, alone: bool = False) -> Result:
    form = datasheet.form_factor(g, nvswitches)
    active, slots = g.nvlink_active or 0, g.nvlink_total or 0
    spec = datasheet.lookup(g.name)
    bridged = spec.bridge_links if spec and spec.bridge_links and spec.bridge_links < slots else None
    total = bridged or slots  # a bridged board is whole at its bridge's links, not at NVML's slot count
    kw = {"value": active, "subject": _sub(g)}
    if form.sxm:  # no bridge on an SXM module: every link is on the board (docs/sources.md#nvlink-per-link: A100 12, H100/H200 18)
        return _sxm_links(active, form.links or total, form.why, kw, alone)
    if total == 0:
        return ok("gpu-nvlink", "no NVLink (PCIe part): multi-GPU traffic goes over PCIe", **kw)
    if active == 0:  # the links exist on the board but no bridge is fitted (DCGM: "NvLink link N is currently down")
        return ok(
            "gpu-nvlink", f"no NVLink bridge fitted (0 of {total} links active): multi-GPU traffic goes over PCIe", **kw
        )
    summary = f"{active} of {total} NVLink links active (bridge)"
    if bridged:
        summary = f"{active} of the {total} links an NVLink bridge gives a {spec.model if spec else g.name} active ({slots} slots listed)"
    if active < total:
        hint = "a bridge is fitted but only part of it links: reseat the NVLink bridge(s) or ask the provider"
        return warn("gpu-nvlink", summary + ": partly active bridge", hint, **kw)
    return ok("gpu-nvlink", summary, **kw)


def _sxm_links(active: int, expected: int, why: str, kw: dict, alone: bool) -> Result:
    part = f"SXM part ({why})"
    if expected == 0:
        hint = "NVML reports no NVLink links on an SXM module: a VM slice that hides them, or a fault; ask the provider"
        return warn("gpu-nvlink", f"{part} but NVML reports no NVLink links", hint, **kw)
    summary = f"{active} of {expected} NVLink links active, {part}"
    if active < expected and alone:
        # A one-GPU slice of an SXM host (recorded on a rented H200 VM: 0 of 18 links up): with no second GPU in
        # the machine no traffic of this rental would cross NVLink, so links that are down cost nothing here.
        return ok("gpu-nvlink", f"{summary}; the only GPU in this machine, so nothing here needs NVLink (a rental of 2+ GPUs would)", **kw)  # fmt: skip
    if active < expected:
        hint = "NVLink links down on an SXM board (no bridge to reseat): GPU-to-GPU traffic falls back to slower paths; report the box to the provider"
        return fail("gpu-nvlink", summary, hint, expected=f"{expected} active", **kw)
    return ok("gpu-nvlink", summary, expected=f"{expected} active", **kw)


def gpu_throttle(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """No hardware slowdown, thermal or power-brake clock events right now.

    Command line equivalent: nvidia-smi -q -d PERFORMANCE.
    """
    return _per_gpu("gpu-throttle", m, cfg, _throttle_one)


def _throttle_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    if g.clock_event_reasons is None:
        return skip("gpu-throttle", "clock event reasons not readable on this card", subject=_sub(g))
    active = [(name, status) for bit, (name, status) in _REASONS.items() if g.clock_event_reasons & bit]
    temp = f", {g.temperature_c} C" if g.temperature_c is not None else ""
    value, subject = hex(g.clock_event_reasons), _sub(g)
    if not active:
        return ok("gpu-throttle", f"no throttling{temp}", value=value, subject=subject)
    worst = Status.FAIL if any(s is Status.FAIL for _, s in active) else Status.WARN
    names = ", ".join(n for n, _ in active)
    hint = "thermal: check fans/airflow and the slowdown temperature; power: see gpu-power; hardware slowdown: report the box"
    return Result("gpu-throttle", worst, f"clocks held back: {names}{temp}", value=value, hint=hint, subject=subject)


def gpu_ecc(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """No uncorrected ECC errors, no pending or failed row remaps, no pending page retirement.

    Command line equivalent: nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT.
    """
    return _per_gpu("gpu-ecc", m, cfg, _ecc_one)


def _ecc_findings(g: GpuFacts) -> Iterator[tuple[Status, str, str]]:
    rows = g.remapped_rows
    if rows and rows.failure:
        yield Status.FAIL, "row remapping failed", "the GPU needs replacing (RMA): ask for another box"
    if rows and rows.pending:
        yield Status.FAIL, "row remap pending", "reset the GPU (nvidia-smi -r, host root) or reboot before training"
    if g.retired_pages_pending:
        yield Status.FAIL, "page retirement pending", "reset the GPU or reboot before training"
    if g.ecc_uncorrected_volatile:
        yield (
            Status.FAIL,
            f"{g.ecc_uncorrected_volatile} uncorrected ECC errors since driver load",
            "the GPU corrupts data: ask for another box",
        )
    if g.ecc_uncorrected_aggregate:
        yield (
            Status.WARN,
            f"{g.ecc_uncorrected_aggregate} uncorrected ECC errors in its lifetime",
            "watch for Xid 48/94/95; keep checkpoints frequent",
        )


def _ecc_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    if g.ecc_enabled is None and g.remapped_rows is None and g.retired_pages_pending is None:
        return ok("gpu-ecc", "ECC not available on this card (consumer boards have none)", subject=_sub(g))
    findings = list(_ecc_findings(g))
    if not findings:
        state = "ECC on" if g.ecc_enabled else "ECC off" if g.ecc_enabled is False else "ECC n/a"
        return ok("gpu-ecc", f"{state}, no uncorrected errors, no pending remaps", subject=_sub(g), value=0)
    worst = Status.FAIL if any(s is Status.FAIL for s, _, _ in findings) else Status.WARN
    summary = "; ".join(t for _, t, _ in findings)
    return Result("gpu-ecc", worst, summary, hint=findings[0][2], subject=_sub(g), value=len(findings))


def gpu_mig(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """MIG is off, or on with instances (MIG on with none leaves CUDA with zero devices).

    Command line equivalent: nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending --format=csv
    """
    return _per_gpu("gpu-mig", m, cfg, _mig_one)


def _mig_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    kw = {"subject": _sub(g), "value": g.mig_enabled}
    if g.mig_enabled is None:
        return ok("gpu-mig", "MIG not available on this card", **kw)
    if g.mig_enabled and not g.mig_devices:
        return fail(
            "gpu-mig",
            "MIG is on with no instances: CUDA sees no device here",
            "create instances (nvidia-smi mig -cgi ... -C) or disable MIG (nvidia-smi -mig 0, then reset)",
            **kw,
        )
    if g.mig_enabled:
        return warn(
            "gpu-mig",
            f"MIG is on: the GPU is split into {g.mig_devices} instance(s); a process sees one slice",
            "for full-GPU training disable MIG (nvidia-smi -i N -mig 0, then reset) or rent an unpartitioned GPU",
            **kw,
        )
    if g.mig_pending:
        return warn(
            "gpu-mig", "MIG is off but enabling it is pending a GPU reset", "a reset will partition the GPU", **kw
        )
    return ok("gpu-mig", "MIG off", **kw)


def gpu_processes(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Nobody else is using this GPU: other processes, or memory in use with no process visible.

    Command line equivalent: nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    """
    return _per_gpu("gpu-processes", m, cfg, _processes_one)


def _processes_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    total = g.memory_total or 0
    kw = {"subject": _sub(g)}
    if g.processes:
        held = sum(p.used_memory or 0 for p in g.processes)
        frac = held / total if total else 0.0
        summary = f"{len(g.processes)} other process(es) hold {held / GIB:.1f} GiB ({frac:.0%} of memory)"
        hint = "another job or tenant shares this GPU: stop it (PIDs are host PIDs, often invisible in a container) or ask the provider"
        judge = fail if frac > cfg.gpu.processes_fail_fraction else warn
        return judge("gpu-processes", summary, hint, value=len(g.processes), **kw)
    used = g.memory_used or 0  # v2 "used" excludes the driver's reservation; v1 includes it (a few hundred MiB)
    if total and used / total > cfg.gpu.idle_memory_warn_fraction:
        summary = f"{used / GIB:.1f} GiB in use with no process visible ({used / total:.0%} of memory)"
        hint = (
            "another container may share this GPU (its processes are invisible here), or a zombie context holds memory"
        )
        return warn("gpu-processes", summary, hint, value=0, **kw)
    if g.processes is None:
        return skip("gpu-processes", "process list not readable on this card", **kw)
    return ok("gpu-processes", "no other processes", value=0, **kw)


def gpu_persistence(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Persistence mode is on (off: slow CUDA start, settings reset when the driver unloads).

    Command line equivalent: nvidia-smi --query-gpu=persistence_mode --format=csv
    """
    return _per_gpu("gpu-persistence", m, cfg, _persistence_one)


def _persistence_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    if g.persistence_mode is None:
        return skip("gpu-persistence", "persistence mode not readable here", subject=_sub(g))
    if g.persistence_mode:
        return ok("gpu-persistence", "persistence mode on", subject=_sub(g), value=True)
    return warn(
        "gpu-persistence",
        "persistence mode off: each CUDA start re-initialises the GPU (seconds)",
        "as root on the host: nvidia-smi -pm 1, or run nvidia-persistenced",
        subject=_sub(g),
        value=False,
    )


def gpu_compute_mode(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Compute mode lets this job use the GPU (Prohibited / Exclusive give CUDA error 46).

    Command line equivalent: nvidia-smi --query-gpu=compute_mode --format=csv
    """
    return _per_gpu("gpu-compute-mode", m, cfg, _compute_mode_one)


def _compute_mode_one(g: GpuFacts, cfg: PreflightConfig) -> Result:
    mode, kw = g.compute_mode, {"subject": _sub(g), "value": g.compute_mode}
    if mode == 2:
        return fail(
            "gpu-compute-mode",
            "compute mode Prohibited: no CUDA context can be created",
            "nvidia-smi -i N -c DEFAULT (root)",
            **kw,
        )
    if mode in (1, 3):  # 1: Exclusive_Thread (deprecated), 3: Exclusive_Process
        return warn(
            "gpu-compute-mode",
            f"compute mode {'Exclusive_Thread' if mode == 1 else 'Exclusive_Process'}: a second process on this GPU fails with error 46",
            "fine for one training process; nvidia-smi -i N -c DEFAULT to share",
            **kw,
        )
    if mode is None:
        return skip("gpu-compute-mode", "compute mode not readable here", **kw)
    return ok("gpu-compute-mode", "compute mode Default", **kw)
