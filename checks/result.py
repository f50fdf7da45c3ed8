"""Results and the report: the data every check returns and every renderer reads.

JSON report, schema 1 (add fields freely; bump ``schema`` only for breaking changes)::

    {
      "schema": 1,
      "tool": "gpu-preflight 0.1.0",
      "host": "gpu-box-01",                 # hostname of the machine judged (from the snapshot when replayed)
      "machine": "live" | "<snapshot file name>",
      "counts": {"ok": 20, "warn": 1, "fail": 0, "skip": 6, "error": 0},
      "results": [
        {"id": "gpu-power",                 # stable kebab-case check id (docs/checks.md lists them all)
         "status": "warn",                  # ok | warn | fail | skip | error
         "summary": "power limit 250 W is 56% of the default 450 W",
         "value": 250.0,                    # the measured / observed value (number, string, object or null)
         "expected": ">= 405 W",            # what would pass (string or null)
         "hint": "nvidia-smi -i 0 -pl 450 (needs root on the host) ...",   # what to do; null when ok
         "subject": "gpu0",                 # per-GPU results name their GPU; null for machine-wide results
         "duration_s": 0.0001}
      ],
      "measurements": {"gpu_bench": [...], ...},  # raw figures behind the results
      "timing": {                           # bootstrap only: where the run's own wall time went
        "seconds": 5.31,                    # gathering to the built report (Python's start-up not included)
        "replayed": false,                  # true: a snapshot was judged, nothing gathered, "phases" empty
        "phases": [
          {"phase": "torch probe",          # one step of gathering or judging, in a fixed order
           "start_s": 0.012,                # from the run's start: steps run side by side overlap
           "seconds": 1.71,
           "facts": ["torch"],              # the facts it gathered (checks/facts.py MachineFacts fields)
           "checks": ["torch-build", ...]}  # the ids of the rows that judge those facts
        ]}
    }
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from checks import TOOL_NAME, TOOL_VERSION

REPORT_SCHEMA = 1


class Status(str, Enum):
    """How a check judged: FAIL the machine is wrong, ERROR the check itself crashed, SKIP a precondition is missing."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"


@dataclass(frozen=True)
class Result:
    """One judgement of one check about one subject (the machine, or one GPU)."""

    id: str
    status: Status
    summary: str
    value: Any = None
    expected: str | None = None
    hint: str | None = None
    subject: str | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status.value,
            "summary": self.summary,
            "value": self.value,
            "expected": self.expected,
            "hint": self.hint,
            "subject": self.subject,
            "duration_s": round(self.duration_s, 6),
        }


def ok(id: str, summary: str, **kw: Any) -> Result:
    return Result(id, Status.OK, summary, **kw)


def warn(id: str, summary: str, hint: str, **kw: Any) -> Result:
    return Result(id, Status.WARN, summary, hint=hint, **kw)


def fail(id: str, summary: str, hint: str, **kw: Any) -> Result:
    return Result(id, Status.FAIL, summary, hint=hint, **kw)


def skip(id: str, reason: str, **kw: Any) -> Result:
    return Result(id, Status.SKIP, reason, **kw)


def timed(result: Result, seconds: float) -> Result:
    return replace(result, duration_s=seconds)


@dataclass(frozen=True)
class Phase:
    """One step of a run's own wall time; ``start_s`` counts from the run's start, so steps that ran side by side
    (the torch child while the host is read) overlap."""

    name: str
    start_s: float
    seconds: float
    facts: tuple[str, ...] = ()  # the MachineFacts fields it gathered
    checks: tuple[str, ...] = ()  # the ids of the rows that judge them

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "start_s": round(self.start_s, 3),
            "seconds": round(self.seconds, 3),
            "facts": list(self.facts),
            "checks": list(self.checks),
        }


@dataclass(frozen=True)
class Timing:
    """Where a run's own wall time went: its phases, or ``replayed`` (a snapshot judged: nothing gathered)."""

    seconds: float
    phases: tuple[Phase, ...] = ()
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "replayed": self.replayed,
            "phases": [p.to_json() for p in self.phases],
        }


class Stopwatch:
    """Times the phases of one run from its start. ``add`` takes stamps read with ``now`` in another thread, so
    the caller decides the order the phases are listed in."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.phases: list[Phase] = []

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def add(self, name: str, began: float, ended: float, facts: tuple[str, ...] = ()) -> None:
        self.phases.append(Phase(name, began - self.began, ended - began, facts))

    @contextmanager
    def phase(self, name: str, facts: tuple[str, ...] = ()) -> Iterator[None]:
        began = self.now()
        yield
        self.add(name, began, self.now(), facts)

    def timing(self, replayed: bool = False) -> Timing:
        return Timing(self.now() - self.began, () if replayed else tuple(self.phases), replayed)


@dataclass(frozen=True)
class Report:
    """All results of one run, plus the raw measurements behind them and (bootstrap) where its time went."""

    host: str
    machine: str
    results: tuple[Result, ...]
    measurements: dict[str, Any] = field(default_factory=dict)
    timing: Timing | None = None

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for r in self.results:
            counts[r.status.value] += 1
        return counts

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing is worse than warn; 1 on any fail or error (or warn with ``strict``)."""
        bad = {Status.FAIL, Status.ERROR} | ({Status.WARN} if strict else set())
        return 1 if any(r.status in bad for r in self.results) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "tool": f"{TOOL_NAME} {TOOL_VERSION}",
            "host": self.host,
            "machine": self.machine,
            "counts": self.counts(),
            "results": [r.to_json() for r in self.results],
            "measurements": self.measurements,
        } | ({"timing": self.timing.to_json()} if self.timing is not None else {})
