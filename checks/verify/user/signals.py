"""The verdict inputs only a run of the user's command has, read for ``checks.verify.diagnosis.Signals``: whether
a CPU run's bf16 is native (``cpuflags``), a map-style dataset's cost split (``itemcost``) and the ops and matrix
FLOPs the agent counted in one warm-up step (the GPU projection of a CPU run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from checks.verify.user import cpuflags, itemcost


class _Lead(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def steps(self) -> list[dict[str, Any]]: ...

    @property
    def flops(self) -> dict[str, Any] | None: ...


def extra(lead: _Lead, events: Sequence[dict[str, Any]], device: str, precision: str | None) -> dict[str, Any]:
    """``Signals`` fields: ``bf16_native``, ``item_cost``, ``ops_per_step``, ``flops_per_step``."""
    count = lead.flops or {}
    return {
        "bf16_native": cpuflags.for_run(device, precision),
        "item_cost": itemcost.item_cost(lead, events),
        "ops_per_step": int(count["ops"]) if count.get("ops") else None,
        "flops_per_step": int(count["flops"]) if count.get("flops") else None,
    }
