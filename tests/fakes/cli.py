"""Running the tool as a user does, for the tests: ``python -m invoke ...`` from the checkout in a child process
(``invoke``), or the same argv through checks.cli.program's PreflightProgram over tasks.ns in this process (``in_process``, the
``here`` fixture of tests/conftest.py).

Every run gets the HOME it is given and an environment without inherited ``INVOKE_PREFLIGHT_*`` /
``PYTORCH_*ALLOC_CONF`` / ``NO_COLOR`` variables.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_INHERITED = re.compile(r"^(INVOKE_PREFLIGHT_|PYTORCH_\w*ALLOC_CONF$|NO_COLOR$)")


@dataclass(frozen=True)
class Run:
    """One finished ``python -m invoke`` process."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str
    seconds: float

    def report(self) -> dict[str, Any]:
        """The JSON report on stdout (the whole of stdout must be the JSON document)."""
        return json.loads(self.out)

    def why(self) -> str:
        """Context for a failed assertion."""
        return f"invoke {' '.join(self.args)} -> {self.code}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def child_env(home: Path, *, colour: bool = False, **extra: str) -> dict[str, str]:
    """The outer environment, cleaned; HOME in ``home``; NO_COLOR=1 unless ``colour``."""
    env = {k: v for k, v in os.environ.items() if not _INHERITED.match(k)}
    env["HOME"] = str(home)
    if not colour:
        env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def invoke(
    home: Path, *args: str, colour: bool = False, timeout: float = 120, env: dict[str, str] | None = None, **extra: str
) -> Run:
    """Run ``python -m invoke ARGS`` in the checkout with HOME=``home``; ``env`` and ``extra`` add variables."""
    assert home.is_dir() and home.resolve() != Path.home().resolve()
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=child_env(home, colour=colour, **(env or {}), **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(tuple(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


Here = Callable[..., Run]


def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Here:
    """``invoke(home, *args, ...)`` in this process: the real tasks and hooks, stdout/stderr captured."""

    def run(home: Path, *args: str, env: dict[str, str] | None = None, **extra: str) -> Run:
        for name in [k for k in os.environ if _INHERITED.match(k)]:
            monkeypatch.delenv(name)
        for name, value in {"HOME": str(home), "NO_COLOR": "1", **(env or {}), **extra}.items():
            monkeypatch.setenv(name, value)
        import tasks  # here, not at the top: a test that never runs a task in-process does not import them
        from checks.cli.program import PreflightProgram

        capsys.readouterr()
        start, code = time.monotonic(), 0
        try:
            PreflightProgram(namespace=tasks.ns, name="invoke", binary="invoke").run(["invoke", *args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Run(tuple(args), code, out, err, time.monotonic() - start)

    return run


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Results keyed by ``id`` or ``id[subject]`` for per-GPU results."""
    return {r["id"] + (f"[{r['subject']}]" if r["subject"] else ""): r for r in report["results"]}


def assert_usage_error(run: Run, *needles: str) -> str:
    """Exit 2, stderr exactly one ``gpu-preflight:`` line holding every needle, no traceback anywhere."""
    assert run.code == 2, run.why()
    assert "Traceback" not in run.err + run.out, run.why()
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.why()
    assert lines[0].startswith("gpu-preflight:"), run.why()
    for needle in needles:
        assert needle in lines[0], run.why()
    return lines[0]


def default_sigint() -> None:
    """``preexec_fn`` for a child a test sends SIGINT: a suite started as a background job (``pytest &``) runs with
    SIGINT ignored, which children inherit and Python then leaves ignored; a terminal's child has the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
