"""The verdict a test planted, read past a crowded box's caveat: ``cpu-contended`` comes first whenever the sampler
saw other processes take the cores (checks/verify/diagnosis.py), which a suite beside other jobs can cause. The
planted bottleneck is then the next verdict; the caveat is never what a test of a pipeline is about."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar


class _Verdict(Protocol):
    @property
    def id(self) -> str: ...


V = TypeVar("V", bound=_Verdict)


def planted(verdicts: Sequence[V]) -> V:
    """The first verdict that is not the crowded box's caveat."""
    return next(v for v in verdicts if v.id != "cpu-contended")


def planted_id(measurements: dict[str, Any]) -> str:
    """The same, from a report's ``measurements.diagnosis``."""
    found = [v["id"] for v in measurements["diagnosis"]["verdicts"]]
    return next((v for v in found if v != "cpu-contended"), measurements["diagnosis"]["verdict"])


def planted_row(measurements: dict[str, Any]) -> dict[str, Any]:
    """The planted verdict's record in ``measurements.diagnosis.verdicts``, past the crowded box's caveat."""
    rows: list[dict[str, Any]] = measurements["diagnosis"]["verdicts"]
    return next((v for v in rows if v["id"] != "cpu-contended"), rows[0])
