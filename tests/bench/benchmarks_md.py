"""BENCHMARKS.md is shared by the benchmark scripts: each owns one section between its own markers."""

from __future__ import annotations

from pathlib import Path

HEADER = "# Benchmarks\n\nNumbers from the scripts under tests/bench/.\n"


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the text between ``begin`` and ``end`` (markers included in ``section``), or append it."""
    text = path.read_text() if path.exists() else HEADER
    if begin in text:
        before, rest = text.split(begin, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
