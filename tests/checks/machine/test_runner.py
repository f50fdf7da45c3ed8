from __future__ import annotations

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.runner import CHECKS, run_checks
from checks.result import Result, Status, ok
from tests.factories import config, machine


def _boom(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    raise KeyError("power_limit")


def _fine(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    return [ok("fine", "all good")]


def test_a_crashing_check_becomes_one_error_and_the_others_still_run() -> None:
    results = run_checks(machine(), config(), checks=(("boom", _boom), ("fine", _fine)))
    assert [(r.id, r.status) for r in results] == [("boom", Status.ERROR), ("fine", Status.OK)]
    assert "KeyError" in results[0].summary and "test_runner.py" in results[0].summary
    assert results[0].hint


def test_every_result_is_timed() -> None:
    assert all(r.duration_s >= 0 for r in run_checks(machine(), config()))


def test_check_ids_are_unique_kebab_case() -> None:
    ids = [check_id for check_id, _ in CHECKS]
    assert len(ids) == len(set(ids))
    assert all(i == i.lower() and " " not in i and "_" not in i for i in ids)


def test_a_healthy_h100_has_no_problem() -> None:
    bad = [r for r in run_checks(machine(), config()) if r.status in (Status.FAIL, Status.WARN, Status.ERROR)]
    assert bad == []
