"""The progress journal of an unfinished staging, and the lock that keeps two runs off one destination.

The journal is append-only JSON lines, each written whole with one ``write`` and fsynced after the data it
describes is on disk: a kill at any moment leaves at most a torn last line, which is dropped on reading.
Completion is known from the journal, never from files existing: rsync and half-written outputs leave files
under their final names (docs/sources.md#rsync-resume).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from datasets.errors import StageFailure, UsageError


class Journal:
    """Events of one staging attempt; the first line holds the fingerprint it belongs to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = _read(path)

    @property
    def fingerprint(self) -> str | None:
        return self.events[0].get("fingerprint") if self.events else None

    def start(self, fingerprint: str) -> None:
        """Begin a fresh journal for ``fingerprint`` (the caller has emptied the staging folder)."""
        self.events = []
        self.append({"event": "start", "fingerprint": fingerprint})

    def append(self, event: dict[str, Any]) -> None:
        """Record ``event`` durably."""
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.events.append(event)

    def has(self, name: str) -> bool:
        """Tell whether an event called ``name`` was recorded."""
        return any(e["event"] == name for e in self.events)

    def last(self, name: str) -> dict[str, Any] | None:
        """Return the latest event called ``name``, or None."""
        found = [e for e in self.events if e["event"] == name]
        return found[-1] if found else None

    def all(self, name: str) -> list[dict[str, Any]]:
        """Return every event called ``name``, oldest first."""
        return [e for e in self.events if e["event"] == name]


def _read(path: Path) -> list[dict[str, Any]]:
    """Read the journal; a torn or garbled line ends it (what follows a kill is not trusted)."""
    events: list[dict[str, Any]] = []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return events
    good = 0
    for raw in data.split(b"\n")[:-1]:  # a last piece without its newline is torn
        try:
            event = json.loads(raw)
        except ValueError:
            break
        if not isinstance(event, dict) or "event" not in event:
            break
        events.append(event)
        good += len(raw) + 1
    if good != len(data):
        with path.open("r+b") as fh:  # cut the torn tail so the next append starts on a clean line
            fh.truncate(good)
    return events


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, and removed on release); another run on the same destination
    fails at once.

    flock is released by the kernel when the process dies, so a kill -9 leaves at most an unlocked file that the
    next run takes (stale locks after a crash are a top complaint, docs/sources.md#stale-locks). The file is
    removed while still locked; a run that opened it just before then holds a removed file once its flock
    succeeds, sees that the path names another file (or none), and takes the file at the path instead.
    """
    fd = _lock_fd(path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        try:
            with suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)


def _lock_fd(path: Path) -> int:
    """Open and flock ``path``, retrying when the file locked is no longer the one at ``path``."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only filesystem, a folder this user cannot write
            dest = path.with_name(path.name.removeprefix(".").removesuffix(".lock"))
            raise UsageError(
                f"--dest {dest}: cannot write in {path.parent}: {exc.strerror or exc}",
                hint="give --dest a path under a folder you can write",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StageFailure(
                f"another stage-data run (pid {holder}) is writing this destination ({path})",
                hint="wait for it to finish, or stop it; a killed run releases the lock by itself",
            ) from None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # the run that held it has just ended and removed it


def _same_file(fd: int, path: Path) -> bool:
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
