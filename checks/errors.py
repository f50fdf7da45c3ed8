"""The project's one error type (a plain exception carrying a hint and an exit code), and how signals stop work.

Nothing here knows the CLI framework: the task layer (``checks/cli/program.py``) turns a ``PreflightError`` into its one
line on stderr and its exit code.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from enum import IntEnum
from types import FrameType


class ExitStatus(IntEnum):
    """Process exit codes of every task."""

    OK = 0  # nothing worse than warn
    PROBLEMS = 1  # any fail or error (or warn with --strict)
    USAGE = 2  # bad flag, bad config, unreadable snapshot
    INTERRUPTED = 130  # Ctrl-C


class PreflightError(Exception):
    """A user-facing error: one line naming the thing, and what to do about it.

    ``message`` is that line as printed (``gpu-preflight: ...`` with the hint in brackets), ``hint`` the hint alone,
    ``code`` the exit status the CLI ends with (usage errors: 2).
    """

    def __init__(self, message: str, hint: str | None = None, code: int = ExitStatus.USAGE) -> None:
        self.message = f"gpu-preflight: {message}" + (f" ({hint})" if hint else "")
        self.hint = hint
        self.code = int(code)
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:  # a worker process's error arrives whole, whatever the subclass
        return Exception.__new__, (type(self),), self.__dict__


class SnapshotError(PreflightError):
    """A machine snapshot that is missing, not JSON, or of an unknown schema."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While measuring, SIGTERM and SIGHUP (a closed SSH session) raise KeyboardInterrupt, so cleanup runs.

    Only in the main thread (signal handlers live there); a signal the process ignores stays ignored (nohup).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s, handler in old.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
