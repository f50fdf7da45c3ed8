"""Errors of stage-data: usage problems exit 2, problems of the run (space, disk, rejects, transfer) exit 1."""

from __future__ import annotations

from checks.errors import ExitStatus, PreflightError


class UsageError(PreflightError):
    """The request cannot work as given: empty source, unknown format, a missing label column (exit 2)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, code=ExitStatus.USAGE)


class StageFailure(PreflightError):
    """The run failed but can be resumed or retried: disk full, too many rejects, a transfer that broke (exit 1)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, code=ExitStatus.PROBLEMS)
