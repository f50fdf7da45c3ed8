"""``until``: the one way a test waits for an event."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import until


def test_until_returns_the_first_truthy_value() -> None:
    answers: Iterator[object] = iter([None, 0, [], "ready"])
    assert until(lambda: next(answers), 5, what="the fourth answer") == "ready"


def test_until_waits_for_a_condition_that_turns_true_later() -> None:
    start = time.monotonic()
    assert until(lambda: time.monotonic() - start > 0.05, 5, what="50 ms to pass")


def test_until_fails_naming_what_it_waited_for_and_the_last_value_seen(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("")  # the child never writes its line

    with pytest.raises(pytest.fail.Exception, match=r"^waited 0.1 s for the child's first line; last seen: ''$"):
        until(log.read_text, 0.1, what="the child's first line")


def test_until_asks_once_more_at_the_deadline() -> None:
    calls: list[float] = []
    with pytest.raises(pytest.fail.Exception):
        until(lambda: calls.append(time.monotonic()), 0.1, what="nothing")
    assert len(calls) >= 2 and calls[-1] - calls[0] >= 0.1


def test_until_retries_an_assertion_and_shows_the_last_one() -> None:
    left = iter([[101, 102], [102], [102]])

    def nothing_left() -> bool:
        pids = next(left, [102])
        assert pids == [], f"still running: {pids}"
        return True

    with pytest.raises(
        pytest.fail.Exception, match=r"for the workers to end; last seen: AssertionError: still running: \[102\]"
    ):
        until(nothing_left, 0.1, what="the workers to end")
    assert until(lambda: True, 1, what="anything")


def test_until_lets_any_other_error_fail_the_test_at_once() -> None:
    def started() -> bool:
        raise ProcessLookupError("no such process")

    start = time.monotonic()
    with pytest.raises(ProcessLookupError):
        until(started, 30, what="the process to start")
    assert time.monotonic() - start < 10  # not the 30 s timeout


def test_until_fails_at_once_when_the_process_that_should_bring_the_event_has_ended(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"^the process ended \(exit 3\) before the marker; last seen: F"):
        until((tmp_path / "marker").exists, 30, what="the marker", while_running=proc)
    assert time.monotonic() - start < 10  # not the 30 s timeout


def test_until_takes_the_event_even_from_a_process_that_has_just_ended(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    proc.wait()
    assert until(marker.exists, 5, what="the marker", while_running=proc)


def test_a_fixed_pause_looks_as_often_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``every``: a state that lasts a moment is looked at every 20 ms, not after a pause that has grown (the
    pauses asked of time.sleep are recorded, so a loaded box cannot change them)."""
    import tests.waiting as waiting

    pauses: list[float] = []
    monkeypatch.setattr(waiting.time, "sleep", pauses.append)
    calls = iter(range(13))
    until(lambda: next(calls) == 12, 5, what="the 13th call", every=0.02)
    assert pauses == [0.02] * 12
    pauses.clear()
    calls = iter(range(13))
    until(lambda: next(calls) == 12, 5, what="the 13th call")
    assert pauses[-1] == waiting.MAX_S and pauses[0] == waiting.FIRST_S  # without it: the growing pause
