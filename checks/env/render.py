"""``invoke diff``'s text: one line per difference, breaks first, what could not be compared, a tally.

Two real boxes differ in a hundred packages or more; the ones training stands on (``package_matters``) keep a
line each, the others are one line per rank and a ``packages:`` count, unless ``--all`` asks for every row. The
JSON (``Diff.to_json``) always holds every difference.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from checks.env.diff import RANKS, Diff, Difference
from checks.probe.env import normalize as normalize_name

# What always matters among the packages, beside preflight.env.packages (what training imports): torch's own CUDA
# libraries and NCCL are its nvidia-* distributions.
_MATTERS_PREFIXES = ("nvidia-",)
# Fewer other packages than this in one rank are listed one by one; more are one line (tool-defined: a screen's
# worth of rows still reads at a glance, the 166 rows of two real boxes did not).
GROUP_FROM = 6


def package_matters(field: str, matter: Collection[str]) -> bool:
    """A ``package:NAME`` field of a package training stands on: one of ``matter``, torch, or an nvidia-* library."""
    name = field.removeprefix("package:")
    return name == "torch" or name in matter or name.startswith(_MATTERS_PREFIXES)


def render_diff(d: Diff, matter: Collection[str] = (), every_row: bool = False) -> str:
    """One line per difference, breaks first, then what could not be compared, and a tally.

    Package differences of packages that do not matter (see ``package_matters``) are one line per rank when there
    are many of them, and a ``packages:`` line counts them; ``every_row`` lists each (``invoke diff --all``)."""
    lines = [f"gpu-preflight diff: A = {d.a}, B = {d.b}"]
    rows = _rows(d.differences, {normalize_name(m) for m in matter}, every_row)
    width = max((len(field) for _, field, _ in rows), default=5)
    lines += [f"  {rank.upper():5} {field:<{width}} {text}" for rank, field, text in rows]
    if not d.differences:
        lines.append("  no differences in what both sides hold")
    lines += _packages_line(d.differences, {normalize_name(m) for m in matter}, every_row)
    lines += [f"  not compared: {m}" for m in d.not_compared]
    counts = d.counts()
    lines += ["", " · ".join(f"{n} {r}" for r, n in counts.items())]
    lines.append(
        "next: fix the break lines first; B will not train like A"
        if counts["break"]
        else "next: nothing breaks training"
    )
    return "\n".join(lines) + "\n"


def _others(differences: tuple[Difference, ...], matter: set[str]) -> list[Difference]:
    return [x for x in differences if x.field.startswith("package:") and not package_matters(x.field, matter)]


def _cuda_libs(differences: tuple[Difference, ...]) -> list[Difference]:
    return [x for x in differences if x.field.startswith("package:nvidia-")]


def _rows(differences: tuple[Difference, ...], matter: set[str], every_row: bool) -> list[tuple[str, str, str]]:
    """(rank, field, text) per line: each difference, except that a rank's many other packages are one line at
    the end of its block, and so are its nvidia-* libraries (each still named)."""
    bundles: dict[str, list[tuple[str, str]]] = {r: [] for r in RANKS}
    bundled: set[Difference] = set()
    for rank in RANKS if not every_row else ():
        libs = [x for x in _cuda_libs(differences) if x.rank == rank]
        if len(libs) >= GROUP_FROM // 2:
            bundles[rank].append(("package:nvidia-*", _group_text(libs, "nvidia-* libraries", every_name=True)))
            bundled |= set(libs)
        others = [x for x in _others(differences, matter) if x.rank == rank and x not in bundled]
        if len(others) >= GROUP_FROM:
            bundles[rank].append(("packages", _group_text(others, "other packages") + "; --all lists them"))
            bundled |= set(others)
    rows = []
    for rank in RANKS:
        rows += [(rank, x.field, f"{_show(x.a)} -> {_show(x.b)}: {x.reason}") for x in differences
                 if x.rank == rank and x not in bundled]  # fmt: skip
        rows += [(rank, field, text) for field, text in bundles[rank]]
    return rows


def _group_text(group: list[Difference], what: str, every_name: bool = False) -> str:
    """'120 other packages missing on B (where A's code imports one, it fails): lib000, ... and 116 more'; one
    part per kind of difference, the largest first; ``every_name`` names each member."""
    by_kind: dict[str, list[str]] = {}
    for x in group:
        by_kind.setdefault(_kind(x), []).append(x.field.removeprefix("package:"))
    kinds = sorted(by_kind.items(), key=lambda kv: -len(kv[1]))
    if len(kinds) == 1:
        kind, names = kinds[0]
        return f"{len(group)} {what} {kind}: {_listing(names, every_name)}"
    parts = [f"{len(names)} {kind}: {_listing(names, every_name)}" for kind, names in kinds]
    return f"{len(group)} {what}: " + "; ".join(parts)


def _listing(names: list[str], every_name: bool) -> str:
    if every_name or len(names) <= 4:
        return ", ".join(names)
    return ", ".join(names[:4]) + f" and {len(names) - 4} more"


def _kind(x: Difference) -> str:
    if x.b is None:
        return "missing on B (where A's code imports one, it fails)"
    if x.a is None:
        return "only on B"
    return "at another version"


def _packages_line(differences: tuple[Difference, ...], matter: set[str], every_row: bool) -> list[str]:
    """'packages: 166 differ: 3 that matter (torch, numpy, transformers + 12 nvidia-* libraries) + 163 others;
    --all lists them', when other packages were counted rather than listed."""
    packages = [x for x in differences if x.field.startswith("package:")]
    others = _others(differences, matter)
    if every_row or not any(sum(x.rank == r for x in others) >= GROUP_FROM for r in RANKS):
        return []
    named = [x.field.removeprefix("package:") for x in packages if x not in others]
    libs = [n for n in named if n.startswith("nvidia-")]
    shown = [n for n in named if not n.startswith("nvidia-")] + (
        [f"{len(libs)} nvidia-* librar{'y' if len(libs) == 1 else 'ies'}"] if libs else []
    )
    that_matter = f"{len(named)} that matter ({', '.join(shown)})" if named else "none that matter"
    return [f"  packages: {len(packages)} differ: {that_matter} + {len(others)} others; --all lists them"]


def _show(value: Any) -> str:
    return "(none)" if value is None else str(value)
