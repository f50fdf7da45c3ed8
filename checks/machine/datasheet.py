"""The GPU datasheet table (``templates/gpus.yaml``): expected figures per card model.

Lookup is by the exact NVML name; a card that is not in the table gets ``None`` and the checks that need
its figures say so. There is never a fallback to another card's numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

TABLE_FILE = Path(__file__).resolve().parents[2] / "templates" / "gpus.yaml"

# Unidirectional x16 payload bandwidth per PCIe generation, GB/s (ref/health-checks.md §3 "PCIe").
PCIE_X16_GB_S = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass(frozen=True)
class GpuSpec:
    model: str
    names: tuple[str, ...]
    cc: tuple[int, int]
    memory_gb: float
    mem_bw_gb_s: float
    tdp_w: float
    pcie_gen: int
    pcie_width: int
    nvlink_links: int
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None

    @property
    def host_link_gb_s(self) -> float:
        """Datasheet host-link bandwidth, one direction."""
        return PCIE_X16_GB_S[self.pcie_gen] * self.pcie_width / 16


@functools.cache
def _table() -> dict[str, GpuSpec]:
    with TABLE_FILE.open(encoding="utf-8") as fh:
        rows = yaml.safe_load(fh)["gpus"]
    table: dict[str, GpuSpec] = {}
    for row in rows:
        spec = GpuSpec(
            model=row["model"],
            names=tuple(row["names"]),
            cc=(row["cc"][0], row["cc"][1]),
            memory_gb=float(row["memory_gb"]),
            mem_bw_gb_s=float(row["mem_bw_gb_s"]),
            tdp_w=float(row["tdp_w"]),
            pcie_gen=int(row["pcie"][0]),
            pcie_width=int(row["pcie"][1]),
            nvlink_links=int(row["nvlink_links"]),
            bf16_tflops=row.get("bf16_tflops"),
            fp16_tflops=row.get("fp16_tflops"),
        )
        for name in spec.names:
            table[name.casefold()] = spec
    return table


def lookup(name: str) -> GpuSpec | None:
    """Return the datasheet row for an NVML device name, or None when the card is not in the table."""
    return _table().get(name.strip().casefold())


def all_specs() -> list[GpuSpec]:
    """Every row of the table, once each."""
    return list({id(s): s for s in _table().values()}.values())
