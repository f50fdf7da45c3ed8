"""Wait for an event instead of sleeping a guessed while: ``until(lambda: path.exists(), 10, what="the marker")``.

A fixed sleep as synchronisation (a handshake, "nothing left", "give it time to start") is either too short on a
loaded box (the flake CI meets) or too long everywhere else. ``until`` polls the real condition with a short
backoff and, on timeout, fails the test with what it waited for and the last value it saw.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

FIRST_S = 0.01  # the first pause: most events here (a process started, a port open) come within tens of ms
MAX_S = 0.25  # the longest pause: at most this late after the event on a slow one


def until(
    predicate: Callable[[], T | None],
    timeout: float,
    *,
    what: str,
    while_running: subprocess.Popen[Any] | None = None,
    every: float | None = None,
) -> T:
    """Call ``predicate`` until it returns something truthy and return that; fail after ``timeout`` seconds, or
    at once when ``while_running`` (the process that should bring the event) has exited first.

    A predicate may also assert: an ``AssertionError`` means "not yet", and the last one is what the failure
    shows (``assert left == [], cmdlines`` says what was left). Any other error fails the test at once. The pause
    between calls starts at ``FIRST_S`` and doubles up to ``MAX_S``; the predicate is called once more at the
    deadline, so a slow last pause cannot cost a pass. ``every``: a fixed pause instead, for a state that lasts only
    a moment (a journal that exists while a run is in its middle, then is gone).
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_S if every is None else every
    while True:
        seen: object
        try:
            seen = predicate()
        except AssertionError as exc:
            seen = exc
        else:
            if seen:
                return seen
        if while_running is not None and while_running.poll() is not None:
            pytest.fail(f"the process ended (exit {while_running.returncode}) before {what}; last seen: {_shown(seen)}")
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"waited {timeout:g} s for {what}; last seen: {_shown(seen)}")
        time.sleep(min(pause, left))
        pause = pause if every is not None else min(pause * 2, MAX_S)


def _shown(seen: object) -> str:
    return f"AssertionError: {seen}" if isinstance(seen, AssertionError) else repr(seen)
