"""Numbers as a reader wants them: a share that is not quite 0 or 100%, a count of parameters or bytes at any
size, money for a tiny run. Each keeps enough digits that a small but real figure never prints as 0.

Bytes come in two units, and every name here says which: binary (``MIB``, ``GIB``: 2**20, 2**30; memory, RAM,
/dev/shm, files and buffers, as NVML, the kernel and torch count them) and decimal (``GB``: 10**9; disks, links and
datasheets, as they are sold). ``size_decimal`` and ``size_binary`` render each. The product's modules take their
constants from here; the scripts that run as standalone children (``checks/probe/scripts/``, verify's
``user/inject/``) cannot import the checkout and keep their own.
"""

from __future__ import annotations

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40  # binary: memory and files
GB = 1e9  # decimal: disks, links and datasheets


def percent(fraction: float) -> str:
    """``0.987`` -> ``99%``; a share that is neither none nor all never reads ``0%`` or ``100%``."""
    if 0 < fraction < 0.005:
        return "<1%"
    if 0.995 <= fraction < 1:
        return ">99%"
    return f"{100 * fraction:.0f}%"


def count(n: float) -> str:
    """``1_900_000`` -> ``1.9M``; ``21_300`` -> ``21.3K``; under a thousand as it is."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def size_decimal(n_bytes: float) -> str:
    """``21_000`` -> ``21 KB``; ``1_234_567`` -> ``1.2 MB`` (decimal units, as disks and links are sold)."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if abs(n_bytes) >= scale:
            value = n_bytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n_bytes:.0f} B"


def size_binary(n_bytes: float) -> str:
    """``3 * GIB`` -> ``3.0 GiB``: MiB below a GiB, GiB below a TiB, TiB above, one decimal (binary units, as memory
    and free space are counted); under a MiB it still reads in MiB (``0.0 MiB`` for an empty folder)."""
    for scale, unit in ((TIB, "TiB"), (GIB, "GiB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / MIB:.1f} MiB"


def money(dollars: float) -> str:
    """``$1,234.56``; under a cent with two significant digits (``$0.0042``), never ``$0.00`` for a real cost."""
    if 0 < abs(dollars) < 0.01:
        return f"${dollars:.2g}"
    return f"${dollars:,.2f}"


def duration(hours: float) -> str:
    """``0.15 h`` -> ``9.0 min``; under a minute in seconds; an hour or more in hours."""
    if hours >= 1:
        return f"{hours:.2f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.1f} min"
    return f"{hours * 3600:.1f} s"
