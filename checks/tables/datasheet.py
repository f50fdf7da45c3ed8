"""The GPU datasheet table (``templates/gpus.yaml``): expected figures per card model, and the form factor.

Lookup is by the exact NVML name; a card that is not in the table gets ``None`` and the checks that need
its figures say so. There is never a fallback to another card's numbers. Whether a card is an SXM module or
a PCIe board does not need the table: ``form_factor`` also reads it off the name and the host.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from checks.facts import GpuFacts

TABLE_FILE = Path(__file__).resolve().parents[2] / "templates" / "gpus.yaml"

# Unidirectional x16 payload bandwidth per PCIe generation, GB/s (docs/sources.md#pcie-link).
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
    bridge_links: int | None = None  # a PCIe board's links through its NVLink bridge(s), when NVML lists more slots

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
            bridge_links=row.get("bridge_links"),
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


@dataclass(frozen=True)
class FormFactor:
    """SXM module or PCIe board, and what said so (shown in results, so a reader can judge the evidence)."""

    sxm: bool
    why: str
    links: int | None = None  # active NVLink links the datasheet table expects of an SXM part


# NVML has no form-factor query (docs/sources.md#nvml-form-factor): the name, NVSwitches on the host and
# the default power limit say it. PCIe markers first: "NVIDIA H100 NVL" carries HBM3 but is a PCIe board.
_PCIE_NAME = re.compile(r"(?<![a-z])(pcie|nvl)(?![a-z])", re.IGNORECASE)
# "A100-SXM4-80GB", "Tesla V100-SXM2-32GB"; H100/H800 SXM5 report "... 80GB HBM3" with no "SXM" (docs/sources.md#nvml-form-factor).
_SXM_NAME = re.compile(r"sxm\d?|(?<![a-z])hbm3e?(?![a-z])", re.IGNORECASE)
# Default power limit at or above this with NVLink links is an SXM module (docs/sources.md#nvml-form-factor: "400/700 W
# is SXM"); PCIe boards with NVLink bridges top out at 350-400 W and the 400-600 W ones say NVL in their name.
SXM_MIN_DEFAULT_POWER_MW = 400_000


def form_factor(g: GpuFacts, nvswitches: int = 0) -> FormFactor:
    """Decide SXM or PCIe from the table, the NVML name, NVSwitches on the host and the default power limit."""
    spec = lookup(g.name)
    if spec is not None:
        return FormFactor(spec.nvlink_links > 0, f"datasheet table: {spec.model}", spec.nvlink_links or None)
    if m := _PCIE_NAME.search(g.name):
        return FormFactor(False, f"'{m.group()}' in the name")
    if m := _SXM_NAME.search(g.name):
        return FormFactor(True, f"'{m.group()}' in the name")
    if nvswitches and g.nvlink_total:
        return FormFactor(True, f"{nvswitches} NVSwitch device(s) on this host: an SXM baseboard")
    power = g.power_default_limit_mw or 0
    if g.nvlink_total and power >= SXM_MIN_DEFAULT_POWER_MW and not (g.brand or "").startswith("geforce"):
        return FormFactor(True, f"default power limit {power / 1000:.0f} W with NVLink: an SXM module")
    return FormFactor(False, "no SXM sign (name, NVSwitch, power)")
