"""The one grading rule of the checks: a figure below its warn line is a warn, below its fail line a fail.

``grade`` compares whatever the check compares, with the operands it names: a fraction of an expected figure
against fractional lines (``gpu-p2p``: 0.6 of the path's line rate), or the figure itself against lines in its
unit (``net-link``: Mbit/s). ``graded`` turns the grade into the check's Result, with the hint only where the
grade is not ok.
"""

from __future__ import annotations

from typing import Any

from checks.result import Result, Status


def grade(value: float, warn_below: float, fail_below: float | None = None) -> Status:
    """FAIL when ``value`` is below ``fail_below``, WARN when it is below ``warn_below``, else OK.

    ``fail_below`` is at or under ``warn_below`` (None: the check never fails on this figure)."""
    if fail_below is not None and value < fail_below:
        return Status.FAIL
    if value < warn_below:
        return Status.WARN
    return Status.OK


def graded(check_id: str, status: Status, summary: str, hint: str | None, **kw: Any) -> Result:
    """The Result of a grade: ``hint`` (what to do) only when the status is not ok."""
    return Result(check_id, status, summary, hint=None if status is Status.OK else hint, **kw)
