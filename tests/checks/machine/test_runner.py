from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine import runner
from checks.machine.runner import CHECKS, READS, fed_by, run_check, run_checks
from checks.result import Phase, Result, Status, ok
from checks.snapshot import load_snapshot
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


def test_every_result_is_timed_with_its_checks_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]  # the runner's clock, which only the slow check moves: no timing of this machine involved

    def slow(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
        clock[0] += 0.05
        return [ok("slow", "took a while"), ok("slow-too", "a second result of the same check")]

    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    results = run_checks(machine(), config(), checks=(("slow", slow), ("fine", _fine)))
    assert [r.id for r in results] == ["slow", "slow-too", "fine"]
    # a check's time is shared by the results it returned
    assert results[0].duration_s == results[1].duration_s == pytest.approx(0.025)
    assert results[2].duration_s == 0.0


def test_check_ids_are_unique_kebab_case() -> None:
    ids = [check_id for check_id, _ in CHECKS]
    assert len(ids) == len(set(ids))
    assert all(i == i.lower() and " " not in i and "_" not in i for i in ids)


def test_a_healthy_h100_has_no_problem() -> None:
    bad = [r for r in run_checks(machine(), config()) if r.status in (Status.FAIL, Status.WARN, Status.ERROR)]
    assert bad == []


class _Unread:
    """A facts field a check must not read: any use of it raises."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"read .{name}")

    def __bool__(self) -> bool:
        raise RuntimeError("read")

    def __iter__(self) -> object:
        raise RuntimeError("read")


def _machines() -> list[MachineFacts]:
    fixtures = sorted((Path(__file__).parents[2] / "fixtures" / "machines").glob("*.json"))
    return [machine(), *(load_snapshot(path)[0] for path in fixtures)]


def test_reads_lists_every_facts_field_each_check_reads() -> None:
    """A field a check reads on any fixture, replaced by one that raises, changes its results: READS must list it
    (READS may list more: reads on paths no fixture takes)."""
    cfg, fields = config(), [f.name for f in dataclasses.fields(MachineFacts)]
    missing: set[tuple[str, str]] = set()
    for m in _machines():
        for check_id, check in CHECKS:
            judged = [(r.status, r.summary) for r in run_check(check_id, check, m, cfg)]
            for name in set(fields) - set(READS[check_id]):
                unread: dict[str, Any] = {name: _Unread()}
                hidden = dataclasses.replace(m, **unread)
                if [(r.status, r.summary) for r in run_check(check_id, check, hidden, cfg)] != judged:
                    missing.add((check_id, name))
    assert not missing, sorted(missing)
    assert set(READS) == {check_id for check_id, _ in CHECKS}


def test_a_phase_feeds_the_rows_of_the_checks_that_read_its_facts() -> None:
    assert fed_by(Phase("disks", 1.0, 3.0, ("disks",))).checks == (
        "disk-mounts",
        "disk-speed",
        "disk-data",
        "disk-checkpoint",
    )
    bench = fed_by(Phase("GPU benchmarks", 4.0, 9.0, ("bench",))).checks
    assert bench == ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")  # gpu-bench's rows, not its runner id
    assert "torch-build" in fed_by(Phase("torch probe", 0.0, 2.0, ("torch",))).checks
    assert fed_by(Phase("checks", 9.0, 0.1)).checks == ()
