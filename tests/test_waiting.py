"""``until``: the one way a test waits for an event."""

from __future__ import annotations

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


def test_until_lets_the_predicate_fail_the_test_itself() -> None:
    def started() -> bool:
        raise AssertionError("the process exited with 1")

    with pytest.raises(AssertionError, match="exited with 1"):
        until(started, 5, what="the process to start")
