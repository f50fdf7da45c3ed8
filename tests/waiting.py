"""Wait for an event instead of sleeping a guessed while: ``until(lambda: path.exists(), 10, what="the marker")``.

A fixed sleep as synchronisation (a handshake, "nothing left", "give it time to start") is either too short on a
loaded box (the flake CI meets) or too long everywhere else. ``until`` polls the real condition with a short
backoff and, on timeout, fails the test with what it waited for and the last value it saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

FIRST_S = 0.01  # the first pause: most events here (a process started, a port open) come within tens of ms
MAX_S = 0.25  # the longest pause: at most this late after the event on a slow one


def until(predicate: Callable[[], T], timeout: float, *, what: str) -> T:
    """Call ``predicate`` until it returns something truthy and return that; fail after ``timeout`` seconds.

    The pause between calls starts at ``FIRST_S`` and doubles up to ``MAX_S``. The predicate is called once more
    at the deadline, so a slow last pause cannot cost a pass. A predicate that raises fails the test with its error.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_S
    while True:
        seen = predicate()
        if seen:
            return seen
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"waited {timeout:g} s for {what}; last seen: {seen!r}")
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_S)
