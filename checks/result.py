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

import json
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from checks import TOOL_NAME, TOOL_VERSION
from checks.errors import PreflightError
from checks.typedjson import TypedJsonError, load, load_record

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

    @classmethod
    def from_json(cls, data: Any, where: str = "result") -> Result:
        return typing.cast(Result, load_record(cls, data, where))


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

    @classmethod
    def from_json(cls, data: Any, where: str = "phase") -> Phase:
        if not isinstance(data, dict) or "phase" not in data:
            raise TypedJsonError(f"{where}: expected an object with a 'phase'")
        return typing.cast(Phase, load_record(cls, {"name": data["phase"]} | _without(data, "phase"), where))


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

    @classmethod
    def from_json(cls, data: Any, where: str = "timing") -> Timing:
        if not isinstance(data, dict):
            raise TypedJsonError(f"{where}: expected a JSON object, got {type(data).__name__}")
        phases = load(tuple[Any, ...], data.get("phases", []), f"{where}.phases")
        rest = _without(data, "phases")
        record = typing.cast(Timing, load_record(cls, rest, where))
        return replace(record, phases=tuple(Phase.from_json(p, f"{where}.phases[{i}]") for i, p in enumerate(phases)))


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


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

    @classmethod
    def from_json(cls, data: Any, where: str = "report") -> Report:
        """The report a ``to_json`` wrote; ``TypedJsonError`` naming the path to what is missing or wrong, and for
        a report of another ``schema`` before anything else is read."""
        if not isinstance(data, dict):
            raise TypedJsonError(f"{where}: expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if schema != REPORT_SCHEMA:
            raise TypedJsonError(
                f"{where}: report schema {schema!r}, this {TOOL_NAME} reads schema {REPORT_SCHEMA}: "
                f"rerun bootstrap or verify to write schema {REPORT_SCHEMA}"
            )
        unknown = sorted(set(data) - set(_REPORT_KEYS))
        if unknown:
            raise TypedJsonError(f"{where}: unknown key {unknown[0]!r}", known=_REPORT_KEYS)
        for key in ("host", "machine", "results"):
            if key not in data:
                raise TypedJsonError(f"{where}: missing key {key!r}")
        load(dict[str, int], data.get("counts", {}), f"{where}.counts")
        load(str, data.get("tool", ""), f"{where}.tool")
        rows = load(tuple[Any, ...], data["results"], f"{where}.results")
        timing = data.get("timing")
        return cls(
            host=load(str, data["host"], f"{where}.host"),
            machine=load(str, data["machine"], f"{where}.machine"),
            results=tuple(Result.from_json(r, f"{where}.results[{i}]") for i, r in enumerate(rows)),
            measurements=load(dict[str, Any], data.get("measurements", {}), f"{where}.measurements"),
            timing=None if timing is None else Timing.from_json(timing, f"{where}.timing"),
        )


_REPORT_KEYS = ("schema", "tool", "host", "machine", "counts", "results", "measurements", "timing")


def read_report(path: Path, what: str = "a report") -> Report:
    """The report in the JSON file ``path``; a ``PreflightError`` (exit 2) naming the file and what is wrong in it:
    not JSON, another schema, a key missing or of the wrong type. ``what`` names the file the reader wanted."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PreflightError(f"{path} does not exist", hint=f"give {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreflightError(f"{path} is not a JSON report ({exc})", hint=f"give {what}") from None
    try:
        return Report.from_json(data, str(path))
    except TypedJsonError as exc:
        raise PreflightError(str(exc), hint=f"give {what} of this gpu-preflight") from None
