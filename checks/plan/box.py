"""This box for ``invoke plan``: its card (a datasheet model) with NVML's free memory, and the RAM available."""

from __future__ import annotations

from pathlib import Path

from checks.facts import MachineFacts, NvmlFacts
from checks.probe.host import read_host
from checks.probe.nvml import read_nvml
from checks.snapshot import load_snapshot
from checks.tables import datasheet


def card_of(nvml: NvmlFacts) -> tuple[str, float] | None:
    """(datasheet model, free bytes) of the first GPU; None without a GPU or for a card the table lacks."""
    for g in nvml.gpus:
        spec = datasheet.lookup(g.name)
        if spec is not None and g.memory_total:
            return spec.model, float(g.memory_total - (g.memory_used or 0))
    return None


def this_box(snapshot: Path | None = None) -> tuple[tuple[str, float] | None, int | None]:
    """The card and the RAM available: read live (NVML and the host readers), or from a snapshot file."""
    if snapshot is not None:
        facts: MachineFacts = load_snapshot(snapshot)[0]
        return card_of(facts.nvml), facts.host.mem_available
    return card_of(read_nvml()), read_host().mem_available
