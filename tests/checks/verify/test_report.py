"""verify's diagnosis row: a verdict that could not clear the box never reads as ok."""

from __future__ import annotations

from checks.result import Status
from checks.verify.contract import ChildResult
from checks.verify.diagnosis import Verdict
from checks.verify.report import diagnosis_rows


def test_a_run_with_no_measured_step_is_a_cant_tell_warn_with_a_fix() -> None:
    judged = diagnosis_rows([], None, ChildResult(interrupted=False), None)
    rows = judged.rows
    assert (rows[0].id, rows[0].status, rows[0].value) == ("diagnosis", Status.WARN, "cant-tell")
    assert rows[0].hint and "--steps" in rows[0].hint
    assert judged.diagnosis == {"verdict": "cant-tell", "verdicts": []}
    assert (judged.upgrade, judged.mfu) == (None, None)


def test_cant_tell_as_the_primary_verdict_warns_and_compute_bound_is_ok() -> None:
    unclear = Verdict("cant-tell", "info", "low", "no single bottleneck", "run with --model on your own pipeline")
    healthy = Verdict("compute-bound", "info", "high", "the math takes 95% of each step", "bf16 autocast")
    assert diagnosis_rows([unclear], None, ChildResult(), None).rows[0].status is Status.WARN
    assert diagnosis_rows([healthy], None, ChildResult(), None).rows[0].status is Status.OK
