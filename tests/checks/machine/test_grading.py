"""The one grading rule: below the fail line fails, below the warn line warns, the lines themselves pass."""

from __future__ import annotations

import pytest

from checks.machine.grading import grade, graded
from checks.result import Status


@pytest.mark.parametrize(
    ("value", "status"),
    [
        (0.0, Status.FAIL),
        (0.39, Status.FAIL),
        (0.4, Status.WARN),
        (0.69, Status.WARN),
        (0.7, Status.OK),
        (1.5, Status.OK),
    ],
)
def test_two_lines_fail_below_the_lower_and_warn_below_the_upper(value: float, status: Status) -> None:
    assert grade(value, warn_below=0.7, fail_below=0.4) is status


def test_without_a_fail_line_the_worst_is_a_warn() -> None:
    assert [grade(v, 0.8) for v in (-1.0, 0.79, 0.8)] == [Status.WARN, Status.WARN, Status.OK]


def test_figures_in_their_own_unit_grade_the_same_way() -> None:
    """net-link's lines are in Mbit/s: 900 is under a 1,000 warn line, 90 under a 100 fail line."""
    assert [grade(v, 1000.0, 100.0) for v in (90.0, 900.0, 1000.0)] == [Status.FAIL, Status.WARN, Status.OK]


def test_a_graded_result_carries_the_hint_only_when_not_ok() -> None:
    kw = {"value": 3.0, "expected": ">= 4 per GPU", "subject": "gpu0"}
    bad = graded("cpu-cores", Status.WARN, "3.0 usable cores per GPU", "pick an offer with more vCPUs", **kw)
    good = graded("cpu-cores", Status.OK, "8.0 usable cores per GPU", "pick an offer with more vCPUs", **kw)
    assert (bad.status, bad.hint, bad.expected, bad.subject) == (
        Status.WARN,
        "pick an offer with more vCPUs",
        ">= 4 per GPU",
        "gpu0",
    )
    assert (good.status, good.hint, good.value, good.expected) == (Status.OK, None, 3.0, ">= 4 per GPU")
