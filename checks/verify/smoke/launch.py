"""Start the smoke-test child and watch it (parent side, no torch).

The training loop runs in its own process and process group, like every other torch call of the tool: a hung
CUDA call or a wedged DataLoader worker cannot hang the task. The parent tails the child's events file for
progress, kills the whole group when the run exceeds its time limit or stops reporting, and on Ctrl-C forwards
SIGINT to the child alone, which stops after the current step and writes a partial result.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "smoke_train.py"
INTERRUPT_GRACE_S = 20.0  # time the child gets to finish its step, read its CUDA events and write the result
_POLL_S = 0.1


@dataclass
class ChildRun:
    """What came back from the child: its (possibly partial) result, events, and why it ended."""

    result: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None  # "timeout", "stalled", "crashed", "killed"
    interrupted: bool = False
    log_tail: str = ""
    seconds: float = 0.0
    rank: int | None = None  # several processes: the rank that failed or hung, when one can be named
    env_kept: tuple[str, ...] = ()  # ``extra_env`` names the caller's environment had set already (theirs was kept)


class _Tail:
    """Read complete JSON lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open(encoding="utf-8") as fh:
                fh.seek(self.offset)
                text = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return []
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out


def child_env(extra_env: Mapping[str, str] | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """The training child's environment: ``extra_env`` under this one (a variable the user exported wins), and
    the names of ``extra_env`` that this environment already set."""
    extra = dict(extra_env or {})
    return {**extra, **os.environ, "PYTHONUNBUFFERED": "1"}, tuple(k for k in extra if k in os.environ)


def run_smoke(
    spec: dict[str, Any],
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda e: None,
    on_start: Callable[[int], None] = lambda pid: None,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
) -> ChildRun:
    """Run the child on ``spec``; return its result (None when it wrote none) and how it ended.

    ``extra_env`` (the allocator setting bootstrap writes for new shells) goes into the child's environment
    unless this environment sets the variable already: a value the user exported is what their run gets.
    """
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-verify-") as tmp:
        work = Path(tmp)
        spec = {**spec, "events": str(work / "events.jsonl"), "result": str(work / "result.json")}
        (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        env, kept = child_env(extra_env)
        start = time.monotonic()
        with (work / "child.log").open("w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                [python, str(SCRIPT), str(work / "spec.json")],
                cwd=work,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        on_start(proc.pid)
        run = ChildRun(result=None, env_kept=kept)
        try:
            _watch(proc, _Tail(work / "events.jsonl"), run, timeout_s, stall_s, on_event)
        finally:
            _kill_group(proc)
        run.seconds = time.monotonic() - start
        run.result = _read_json(work / "result.json")
        run.log_tail = _tail(work / "child.log")
        if run.result is None and run.failure is None:
            run.failure = "crashed"
        return run


def _watch(
    proc: subprocess.Popen[bytes],
    tail: _Tail,
    run: ChildRun,
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[dict[str, Any]], None],
) -> None:
    """Poll until the child exits, times out, stalls or is interrupted."""
    deadline, last_news = time.monotonic() + timeout_s, time.monotonic()
    try:
        while proc.poll() is None:
            news = tail.read()
            for event in news:
                run.events.append(event)
                on_event(event)
            now = time.monotonic()
            last_news = now if news else last_news
            if now > deadline or now - last_news > stall_s:
                run.failure = "timeout" if now > deadline else "stalled"
                return
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        run.interrupted = True
        _interrupt(proc)
    run.events += tail.read()


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    """Forward Ctrl-C to the child alone (its workers stop with it); a second Ctrl-C or the grace time kills."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.wait(timeout=INTERRUPT_GRACE_S)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (the child, its DataLoader workers, compile workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
