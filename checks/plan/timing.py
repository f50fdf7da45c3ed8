"""Step time and epoch cost on each card class, scaled from a verify report of this model (``--from``).

Per sample, the report's step splits into shares (checks/verify/figures.py): forward + backward scale with
the dense peak of the dtype (the same MFU on every card); the optimizer step, an elementwise pass over ~16 B per
parameter, scales with memory bandwidth; data wait, host-to-device copies and checkpoints do not scale (Amdahl).
With N > 1 GPUs each step adds a ring all-reduce of the gradients, 2(N-1)/N x bytes at a bus bandwidth of ~80%
of the one-way line rate (docs/sources.md#nccl-ring-efficiency, docs/sources.md#pcie-p2p-host: NVLink links x 25 GB/s, else the
PCIe link), not overlapped with compute (an upper bound); ZeRO-3 moves ~50% more (docs/sources.md#zero-model-states).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.errors import PreflightError
from checks.reports.verify import Measurements
from checks.result import read_report as read_json_report
from checks.tables import datasheet
from checks.tables.datasheet import GpuSpec
from checks.typedjson import ContractError

SCALES_WITH_PEAK = ("forward", "backward")
SCALES_WITH_BANDWIDTH = ("optimizer",)
BUS_EFFICIENCY = 0.8  # ring busbw / one-way line rate (docs/sources.md#nccl-ring-efficiency)
NVLINK_GB_S_PER_LINK = 25.0  # one direction, NVLink 2-4 (docs/sources.md#nvlink-per-link)
ZERO3_COMM = 1.5  # parameter partitioning adds ~50% communication (ZeRO §7, docs/sources.md#zero-model-states)


@dataclass(frozen=True)
class Baseline:
    """What the verify report measured, per sample, on its card."""

    card: GpuSpec
    precision: str
    per_sample_s: float
    shares: dict[str, float]
    parameters: int
    host: str
    model: str


def peak(spec: GpuSpec, precision: str) -> float | None:
    """Dense 16-bit peak in TFLOPS (bf16, else the fp16 figure of pre-Ampere cards)."""
    return spec.bf16_tflops or spec.fp16_tflops if precision in ("bf16", "fp16") else None


def read_report(path: Path) -> Baseline:
    """A verify JSON report's baseline, read by the typed readers (``Report``, verify's ``Measurements``); a
    report that cannot be read or scaled is a usage error naming why."""
    report = read_json_report(path, "a verify --json report")
    try:
        m = Measurements.from_json(report.measurements, f"{path}.measurements")
    except ContractError as exc:
        raise PreflightError(f"--from {exc}", hint="give a verify --json report of this gpu-preflight") from None
    device = m.run.device
    if device is None or device.type != "cuda":
        raise PreflightError(
            f"--from {path}: the verify run was on the CPU, which has no GPU peak to scale from",
            hint="run invoke verify --model ... on a rented GPU box, then plan --from its report",
        )
    spec = datasheet.lookup(device.name)
    if spec is None:
        raise PreflightError(
            f"--from {path}: {device.name} is not in templates/gpus.yaml; no other card's figures are used"
        )
    steps = m.steps
    if steps is None or not steps.samples_per_s or not steps.step_breakdown:
        raise PreflightError(f"--from {path}: the report has no measured steps (samples_per_s, step_breakdown)")
    precision = m.run.precision or ""
    if peak(spec, precision) is None:
        raise PreflightError(f"--from {path}: a {precision or 'fp32'} run cannot be scaled by the table's 16-bit peaks")
    model = m.run.model
    return Baseline(
        spec,
        precision,
        1.0 / steps.samples_per_s,
        dict(steps.step_breakdown),
        model.parameters if model else 0,
        report.host,
        model.name if model else "?",
    )


def bus_gb_s(spec: GpuSpec) -> float:
    line = spec.nvlink_links * NVLINK_GB_S_PER_LINK if spec.nvlink_links else spec.host_link_gb_s
    return BUS_EFFICIENCY * line


def per_sample_s(base: Baseline, spec: GpuSpec) -> float:
    """Seconds per sample on one GPU of ``spec``, from the baseline's shares."""
    top, here = peak(base.card, base.precision) or 1.0, peak(spec, base.precision) or 1.0
    s = base.shares
    compute = sum(s.get(k, 0.0) for k in SCALES_WITH_PEAK) * top / here
    memory = sum(s.get(k, 0.0) for k in SCALES_WITH_BANDWIDTH) * base.card.mem_bw_gb_s / spec.mem_bw_gb_s
    rest = 1.0 - sum(s.get(k, 0.0) for k in SCALES_WITH_PEAK + SCALES_WITH_BANDWIDTH)
    return base.per_sample_s * (compute + memory + max(rest, 0.0))


def comm_s(spec: GpuSpec, gpus: int, grad_bytes: float, sharding: str) -> float:
    if gpus <= 1:
        return 0.0
    volume = 2 * (gpus - 1) / gpus * grad_bytes * (ZERO3_COMM if sharding == "zero3" else 1.0)
    return volume / (bus_gb_s(spec) * 1e9)


def epoch(
    base: Baseline,
    spec: GpuSpec,
    gpus: int,
    batch: int,
    grad_bytes: float,
    sharding: str,
    samples: int,
    price: float | None,
) -> dict[str, Any]:
    """Step time, samples/s and (with a dataset size) hours and cost of one epoch on ``gpus`` x ``spec``."""
    sample_s = per_sample_s(base, spec)
    step = sample_s * batch + comm_s(spec, gpus, grad_bytes, sharding)
    rate = gpus * batch / step
    out: dict[str, Any] = {"step_s": step, "samples_per_s": rate, "comm_s": comm_s(spec, gpus, grad_bytes, sharding)}
    if samples:
        out["epoch_hours"] = samples / rate / 3600
        if price is not None:
            out["price_per_hour"] = price * gpus
            out["epoch_cost"] = out["epoch_hours"] * price * gpus
    elif price is not None:
        out["price_per_hour"] = price * gpus
        out["per_million_samples"] = 1e6 / rate / 3600 * price * gpus
    return out
