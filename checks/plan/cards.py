"""Each card class of templates/gpus.yaml against the model: fits, the largest micro-batch, the fewest GPUs.

A card's usable memory is its datasheet size in GiB times ``plan.nvml_total_fraction`` (NVML reports a little
less than the marketing figure); the card this box has uses NVML's free memory instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from checks.config import PlanConfig
from checks.plan.memory import SHARD_ORDER, Breakdown, Setup, largest_batch, per_gpu
from checks.plan.model import ModelSize
from checks.tables.datasheet import GpuSpec
from checks.units import GIB


@dataclass(frozen=True)
class Option:
    """One card class: how many GPUs, which sharding, and what each GPU holds at the requested micro-batch."""

    spec: GpuSpec
    usable: float  # bytes per GPU the plan may fill
    this_box: bool
    fits: bool
    gpus: int
    sharding: str
    memory: Breakdown
    largest_batch: int  # at this N and sharding
    why: str = ""  # when nothing fits


def usable_bytes(spec: GpuSpec, cfg: PlanConfig) -> float:
    return spec.memory_gb * GIB * cfg.nvml_total_fraction


def _candidates(gpus: int, sharding: str, cfg: PlanConfig) -> list[tuple[int, str]]:
    """(N, sharding) in the order tried: fewest GPUs first, least communication first at each N."""
    counts = [gpus] if gpus else [n for n in (1 << k for k in range(17)) if n <= cfg.max_gpus]
    out = []
    for n in counts:
        modes = [sharding] if sharding != "auto" else (["ddp"] if n == 1 else list(SHARD_ORDER[1:]))
        out += [(n, m) for m in modes]
    return out


def option(
    m: ModelSize, setup: Setup, cfg: PlanConfig, spec: GpuSpec, usable: float, batch: int, gpus: int, sharding: str
) -> Option:
    """The first (N, sharding) that fits ``batch``; when none does, the last one tried, marked as not fitting."""
    mode = "zero3" if sharding == "fsdp" else sharding
    tried = _candidates(gpus, mode, cfg)
    for n, s in tried:
        mem = per_gpu(m, setup, cfg, batch, n, s)
        if mem.total <= usable:
            return Option(spec, usable, False, True, n, s, mem, largest_batch(m, setup, cfg, usable, n, s))
    n, s = tried[-1]
    mem = per_gpu(m, setup, cfg, batch, n, s)
    why = f"needs {mem.total / GIB:.1f} GiB per GPU at {n} x {s}, {usable / GIB:.1f} GiB usable"
    return Option(spec, usable, False, False, n, s, mem, largest_batch(m, setup, cfg, usable, n, s), why)
