"""What the tasks say on the terminal: a report's text and its JSON, progress lines, and the exit code.

The CLI layer's own helpers (tasks.py and ``checks/cli/program.py`` only): library code never prints and never exits.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from invoke.exceptions import Exit

from checks.errors import ExitStatus, PreflightError
from checks.fileio import write_atomic
from checks.render import use_colour


def say(line: str) -> None:
    """One line on stderr (progress and notes, never the report)."""
    sys.stderr.write(line + "\n")


class LiveLine:
    """Progress while a task works: on a terminal one line rewritten in place; anywhere else (a log file, CI,
    ``| tee``) a whole line at most every ``every_s`` seconds, so a log shows the work going on without a line
    per update. ``close()`` ends the rewritten line."""

    def __init__(self, stream: TextIO, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self.tty = stream.isatty()
        self.last = clock()
        self.open = False

    def __call__(self, text: str) -> None:
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + text[:width] + "\x1b[K")
            self.open = True
        elif self.clock() - self.last >= self.every_s:
            self.last = self.clock()
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.open = False


def text_stream(json_path: str) -> TextIO:
    """stdout for the text, or stderr when the JSON goes to stdout (``--json -``)."""
    return sys.stderr if json_path == "-" else sys.stdout


def _unwritable(path: Path, why: str = "") -> PreflightError:
    return PreflightError(f"cannot write the JSON report to {path}{why}", hint="pick a writable --json path")


def check_output_path(json_path: str) -> None:
    """Fail before the run, not after it, when the JSON report cannot be written."""
    if not json_path or json_path == "-":
        return
    path = Path(json_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, f": {exc.strerror}") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise _unwritable(path)


def emit(render: Callable[[bool], str], doc: Mapping[str, Any] | None, json_path: str) -> None:
    """The text (``render(colour)``, coloured on a terminal) and, with ``json_path``, the JSON ``doc`` to its place."""
    stream = text_stream(json_path)
    stream.write(render(use_colour(stream, os.environ)))
    if not json_path or doc is None:
        return
    payload = json.dumps(doc, indent=2) + "\n"
    if json_path == "-":
        sys.stdout.write(payload)
        return
    try:
        write_atomic(Path(json_path), payload)
    except OSError as exc:
        raise _unwritable(Path(json_path), f": {exc.strerror}") from None


def exit_with(code: int) -> None:
    """End the task with ``code`` (nothing for 0)."""
    if code:
        raise Exit(code=code)


@contextmanager
def interruptible(message: str = "interrupted") -> Iterator[None]:
    """Ctrl-C ends the task with exit 130 and one line, not a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        raise PreflightError(message, code=ExitStatus.INTERRUPTED) from None
