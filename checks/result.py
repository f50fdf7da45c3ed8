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
      "measurements": {"gpu_bench": [...], ...}   # raw figures behind the results
    }
"""

from __future__ import annotations

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
class Report:
    """All results of one run, plus the raw measurements behind them."""

    host: str
    machine: str
    results: tuple[Result, ...]
    measurements: dict[str, Any] = field(default_factory=dict)

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
        }
