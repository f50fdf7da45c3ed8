"""Drift between the hosts of a fleet: driver, torch, its CUDA build, NCCL, Python and the packages that differ.

Read from each host's ``measurements.environment`` (``checks.reports.bootstrap.Environment``). DDP needs every rank on
the same torch, CUDA build and NCCL: mixed NCCL versions hang a job at its first collective (the seed
article §4.3), so a host that differs from the majority in those is a fail; other drift (driver, Python, a package)
is a warn. A tie has no majority: every host outside the first-seen value is named.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from checks.reports.bootstrap import BootstrapMeasurements, Environment
from checks.result import Result, fail, warn

FIELDS = (
    ("driver", "driver"),
    ("torch", "torch"),
    ("torch_cuda", "CUDA build"),
    ("nccl", "NCCL"),
    ("python", "Python"),
)
FAIL_FIELDS = frozenset({"torch", "torch_cuda", "nccl"})
OF_TORCH = frozenset({"torch_cuda", "nccl"})  # read from torch: a host without torch differs in them by its torch alone


def environments(measured: Mapping[str, BootstrapMeasurements]) -> dict[str, Environment]:
    """Each reporting host's environment section (hosts whose report predates it are left out)."""
    return {name: m.environment for name, m in measured.items() if m.environment is not None}


def drifting_packages(envs: dict[str, Environment]) -> list[str]:
    """Packages whose version (or presence) is not the same on every host (torch is its own field: a fail)."""
    names = sorted({p for e in envs.values() for p in e.packages} - {"torch"})
    return [n for n in names if len({e.packages.get(n) for e in envs.values()}) > 1]


def drift_table(envs: dict[str, Environment]) -> list[list[str]]:
    """Rows: host, the fields, then the packages that differ (empty when every host agrees on everything)."""
    packages = drifting_packages(envs)
    fields = [k for k, _ in FIELDS if len({e.value(k) for e in _with_torch(envs, k).values()}) > 1]
    if len(envs) < 2 or not (fields or packages):
        return []
    head = ["host", *(dict(FIELDS)[k] for k in fields), *packages]
    rows = [head]
    for host, e in envs.items():
        rows.append([host, *(str(e.value(k) or "-") for k in fields), *(e.packages.get(p) or "-" for p in packages)])
    return rows


def _with_torch(envs: dict[str, Environment], key: str) -> dict[str, Environment]:
    """The hosts a field is compared over: for torch's CUDA build and NCCL, those that have torch (a host without
    it is the torch row's fail, not three)."""
    return {h: e for h, e in envs.items() if key not in OF_TORCH or e.torch}


def _majority(values: dict[str, str | None]) -> str | None:
    counts = Counter(values.values())
    top = counts.most_common()
    return top[0][0] if top else None


def drift_results(envs: dict[str, Environment]) -> list[tuple[str | None, Result]]:
    """One result per host that differs from the majority (fail for torch, CUDA build, NCCL; warn otherwise)."""
    if len(envs) < 2:
        return []
    out: list[tuple[str | None, Result]] = []
    fields = [*FIELDS, *((f"package:{p}", p) for p in drifting_packages(envs))]
    for key, label in fields:
        values = {h: e.value(key) for h, e in _with_torch(envs, key).items()}
        if len(set(values.values())) < 2:
            continue
        usual = _majority(values)
        for host, value in values.items():
            if value == usual:
                continue
            summary = f"{host}: {label} {value or 'missing'}, the majority has {usual or 'none'}"
            if key in FAIL_FIELDS:
                hint = f"DDP ranks need the same {label}: install {label} {usual} on {host} (or run that host apart)"
                out.append((host, fail("fleet-drift", summary, hint, subject=label, value=value, expected=usual)))
            else:
                hint = f"make {host} match the others (invoke lock on one host, invoke bootstrap --lock there)"
                out.append((host, warn("fleet-drift", summary, hint, subject=label, value=value, expected=usual)))
    return out
