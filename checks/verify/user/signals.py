"""The verdict inputs only a run of the user's command has, read for ``checks.verify.diagnosis.Signals``: whether
a CPU run's bf16 is native (``cpuflags``), a map-style dataset's cost split (``itemcost``) and the ops and matrix
FLOPs the agent counted in one warm-up step (the GPU projection of a CPU run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from checks.verify.events import Event, FlopsLine, StepLine
from checks.verify.user import cpuflags, itemcost


class _Lead(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def steps(self) -> list[StepLine]: ...

    @property
    def flops(self) -> FlopsLine | None: ...


def extra(lead: _Lead, events: Sequence[Event], device: str, precision: str | None) -> dict[str, Any]:
    """``Signals`` fields: ``bf16_native``, ``item_cost``, ``ops_per_step``, ``flops_per_step``."""
    count = lead.flops
    return {
        "bf16_native": cpuflags.for_run(device, precision),
        "item_cost": itemcost.item_cost(lead, events),
        "ops_per_step": (count.ops or None) if count else None,
        "flops_per_step": (count.flops or None) if count else None,
    }
