"""BENCHMARKS.md is shared by the benchmark scripts: each owns one section between its own markers."""

from __future__ import annotations

import platform
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


def cpu_machine_line() -> str:
    """The machine a CPU benchmark ran on: CPU model, usable cores, RAM, Python, torch (read through the probe)."""
    from checks.probe.host import read_host
    from checks.probe.torch import read_torch

    host, torch = read_host(), read_torch()
    ram = f"{(host.mem_total or 0) / 1024**3:.0f} GiB RAM"
    return (
        f"{host.cpu_model or platform.processor()}, {host.usable_cores:g} usable cores, {ram}, "
        f"Python {platform.python_version()}, torch {torch.version}, no GPU"
    )
