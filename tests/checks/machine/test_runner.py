from __future__ import annotations

import time

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


def _slow(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    time.sleep(0.05)
    return [ok("slow", "took a while"), ok("slow-too", "a second result of the same check")]


def test_every_result_is_timed_with_its_checks_duration() -> None:
    results = run_checks(machine(), config(), checks=(("slow", _slow), ("fine", _fine)))
    assert [r.id for r in results] == ["slow", "slow-too", "fine"]
    # a check's time is shared by the results it returned
    assert results[0].duration_s == results[1].duration_s
    assert results[0].duration_s + results[1].duration_s >= 0.05
    assert results[2].duration_s < 0.05


def test_check_ids_are_unique_kebab_case() -> None:
    ids = [check_id for check_id, _ in CHECKS]
    assert len(ids) == len(set(ids))
    assert all(i == i.lower() and " " not in i and "_" not in i for i in ids)


def test_a_healthy_h100_has_no_problem() -> None:
    bad = [r for r in run_checks(machine(), config()) if r.status in (Status.FAIL, Status.WARN, Status.ERROR)]
    assert bad == []
