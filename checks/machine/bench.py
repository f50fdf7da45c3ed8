"""Judge the GPU micro-benchmarks against the datasheet, and flag a GPU far below its siblings.

The figures come from the probe (``checks/probe/torch.py`` runs them on the live GPUs); here they are only
compared: host link vs the PCIe spec, device copy vs memory bandwidth, dense matmul vs the tensor peak.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from checks.config import BenchConfig, PreflightConfig
from checks.facts import GpuBench, GpuFacts, MachineFacts
from checks.machine.grading import grade
from checks.result import Result, Status, skip
from checks.tables import datasheet
from checks.tables.datasheet import GpuSpec


@dataclass(frozen=True)
class _Metric:
    id: str
    label: str
    unit: str
    read: Callable[[GpuBench], float | None]
    spec: Callable[[GpuSpec, GpuBench], float | None]
    warn: Callable[[BenchConfig], float]
    fail: Callable[[BenchConfig], float]
    hint: str


def _peak(spec: GpuSpec, b: GpuBench) -> float | None:
    if b.matmul_dtype == "bfloat16":
        return spec.bf16_tflops
    if b.matmul_dtype == "float16":
        return spec.fp16_tflops or spec.bf16_tflops
    return None  # no fp32 peak in the table: never judge against another dtype's figure


METRICS = (
    _Metric(
        "gpu-h2d",
        "pinned host->device",
        "GB/s",
        lambda b: b.h2d_gb_s,
        lambda s, b: s.host_link_gb_s,
        lambda c: c.link_warn_fraction,
        lambda c: c.link_fail_fraction,
        "slow host link: see gpu-pcie (riser, x8 slot, Gen3); NUMA placement also matters",
    ),
    _Metric(
        "gpu-d2h",
        "device->pinned host",
        "GB/s",
        lambda b: b.d2h_gb_s,
        lambda s, b: s.host_link_gb_s,
        lambda c: c.link_warn_fraction,
        lambda c: c.link_fail_fraction,
        "slow host link: see gpu-pcie (riser, x8 slot, Gen3)",
    ),
    _Metric(
        "gpu-d2d",
        "device copy",
        "GB/s",
        lambda b: b.d2d_gb_s,
        lambda s, b: s.mem_bw_gb_s,
        lambda c: c.d2d_warn_fraction,
        lambda c: c.d2d_fail_fraction,
        "memory bandwidth far below spec: check gpu-throttle and clocks; a repeat after a minute rules out warm-up",
    ),
    _Metric(
        "gpu-matmul",
        "dense matmul",
        "TFLOPS",
        lambda b: b.matmul_tflops,
        _peak,
        lambda c: c.matmul_warn_fraction,
        lambda c: c.matmul_fail_fraction,
        "compute far below spec: check gpu-power (cap), gpu-throttle (thermal) and other processes",
    ),
)


def gpu_bench(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Host link, device copy and matmul throughput as % of the datasheet, plus outliers within the box."""
    b = m.bench
    if b is None or b.skipped or not b.gpus:
        reason = b.skipped if b and b.skipped else "GPU micro-benchmarks were not run"
        return [skip(metric.id, reason) for metric in METRICS]
    gpus = {g.index: g for g in m.nvml.gpus}
    results: list[Result] = []
    for metric in METRICS:
        results += _judge_metric(metric, b.gpus, gpus, cfg.bench, b.recorded)
    return results


def _judge_metric(
    metric: _Metric, benches: tuple[GpuBench, ...], gpus: dict[int, GpuFacts], cfg: BenchConfig, recorded: bool
) -> list[Result]:
    medians = _sibling_medians(metric, benches, gpus)
    out = []
    for b in benches:
        g = gpus.get(b.index)
        name = g.name if g else f"GPU {b.index}"
        out.append(_judge_one(metric, b, name, medians.get(name), cfg, recorded))
    return out


def _sibling_medians(metric: _Metric, benches: tuple[GpuBench, ...], gpus: dict[int, GpuFacts]) -> dict[str, float]:
    by_name: dict[str, list[float]] = {}
    for b in benches:
        value, g = metric.read(b), gpus.get(b.index)
        if value is not None and g is not None:
            by_name.setdefault(g.name, []).append(value)
    return {name: statistics.median(vals) for name, vals in by_name.items() if len(vals) >= 2}


def _judge_one(
    metric: _Metric, b: GpuBench, name: str, median: float | None, cfg: BenchConfig, recorded: bool
) -> Result:
    subject, value = f"gpu{b.index}", metric.read(b)
    if b.error or value is None:
        return Result(
            metric.id,
            Status.FAIL,
            f"benchmark failed on this GPU: {b.error or 'no figure'}",
            subject=subject,
            hint="rerun bootstrap; a repeat failure on one GPU points at that GPU",
        )
    spec = datasheet.lookup(name)
    expected = metric.spec(spec, b) if spec else None
    label = f"{metric.label} {value:.1f} {metric.unit}" + (f" ({b.matmul_dtype})" if metric.id == "gpu-matmul" else "")
    label += " [recorded]" if recorded else ""
    status, parts, hint = Status.OK, [label], None
    if expected:
        frac = value / expected
        parts.append(f"{frac:.0%} of the {expected:g} {metric.unit} datasheet figure")
        status = grade(frac, metric.warn(cfg), metric.fail(cfg))
        hint = None if status is Status.OK else metric.hint
    else:
        parts.append(f"no datasheet figure for {name}")
    if median and value < cfg.outlier_fraction * median:
        parts.append(
            f"outlier: {value / median:.0%} of the {median:.1f} {metric.unit} median of identical GPUs in this box"
        )
        status = Status.FAIL if status is Status.FAIL else Status.WARN
        hint = hint or "one GPU far below its identical siblings: report it, or exclude it with CUDA_VISIBLE_DEVICES"
    return Result(
        metric.id,
        status,
        ", ".join(parts),
        value=round(value, 2),
        expected=f"{expected * metric.warn(cfg):.1f} {metric.unit}" if expected else None,
        hint=hint,
        subject=subject,
    )
