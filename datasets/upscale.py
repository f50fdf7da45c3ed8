"""Say when ``--size`` is larger than the source images: every row is enlarged, adding bytes but no detail.

Staged rows are all S x S x 3, so a smaller photo cannot be kept at its own size: stage-data enlarges it as asked,
and says so with the figures (the sources' short side, S, the bytes it costs, and the size that matches them).
"""

from __future__ import annotations

from checks.units import size_binary
from datasets.images import short_sides
from datasets.inventory import Inventory
from datasets.request import ImageJob

SAMPLE = 50  # headers read, spread evenly over the inputs: enough for a median, milliseconds on a local disk


def warning(job: ImageJob, inv: Inventory) -> str | None:
    """Return one line when the median short side of a sample of the inputs is under ``--size``; else None."""
    if inv.kind != "images" or not inv.paths:
        return None
    n = len(inv.paths)
    picked = sorted({i * n // SAMPLE for i in range(SAMPLE)}) if n > SAMPLE else range(n)
    sides = sorted(short_sides([inv.path(i) for i in picked]))
    if not sides or sides[len(sides) // 2] >= job.size:
        return None
    median, s = max(8, sides[len(sides) // 2]), job.size
    return (
        f"--size {s} enlarges the source images ~{s / median:.0f}x: their short side is {_span(sides)} px "
        f"(median {median} px, {len(sides)} of {n:,} images read); as {s}x{s}x3 rows they take "
        f"{size_binary(n * s * s * 3)} in all, where --size {median} would take {size_binary(n * median * median * 3)}"
    )


def _span(sides: list[int]) -> str:
    return str(sides[0]) if sides[0] == sides[-1] else f"{sides[0]}-{sides[-1]}"
