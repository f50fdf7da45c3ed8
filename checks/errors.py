"""The project's one error type: an Invoke ``Exit`` that carries a hint and an exit code."""

from __future__ import annotations

from enum import IntEnum

from invoke.exceptions import Exit


class ExitStatus(IntEnum):
    """Process exit codes of every task."""

    OK = 0  # nothing worse than warn
    PROBLEMS = 1  # any fail or error (or warn with --strict)
    USAGE = 2  # bad flag, bad config, unreadable snapshot
    INTERRUPTED = 130  # Ctrl-C


class PreflightError(Exit):
    """A user-facing error: one line naming the thing, and what to do about it."""

    def __init__(self, message: str, hint: str | None = None, code: int = ExitStatus.USAGE) -> None:
        self.hint = hint
        text = f"gpu-preflight: {message}" + (f" ({hint})" if hint else "")
        super().__init__(text, code=int(code))

    def __str__(self) -> str:
        return self.message or ""


class SnapshotError(PreflightError):
    """A machine snapshot that is missing, not JSON, or of an unknown schema."""
