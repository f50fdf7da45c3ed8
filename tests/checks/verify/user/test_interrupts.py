"""Ctrl-C at the worst moments of ``verify -- COMMAND``: the report is written and the exit is 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checks.probe.sample import process_tree
from tests.checks.verify.user.test_command import CHECKOUT, DRIVER, SCRIPTS
from tests.waiting import until

pytestmark = pytest.mark.slow


def test_ctrl_c_while_the_command_shuts_down_still_writes_the_report(tmp_path: Path) -> None:
    """The first Ctrl-C stops the command, which takes 4 s to end (its workers shutting down); a second Ctrl-C
    meanwhile used to escape verify's clean-up and end it with no report."""
    mark, out = tmp_path / "mark", tmp_path / "r.json"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    argv = [sys.executable, str(driver), str(out), str(SCRIPTS), sys.executable, "slow_shutdown.py", str(mark)]
    before = process_tree(os.getpid())
    # A child started from a background job inherits SIGINT ignored: give it the default handler, as a terminal would.
    proc = subprocess.Popen(argv, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    until(lambda: Path(f"{mark}.stepped").exists(), 60, what="4 steps of the command", while_running=proc)
    proc.send_signal(signal.SIGINT)
    until(lambda: Path(f"{mark}.closing").exists(), 30, what="the command starting to shut down", while_running=proc)
    proc.send_signal(signal.SIGINT)  # again, while it shuts down
    assert proc.wait(timeout=60) == 130
    m = json.loads(out.read_text(encoding="utf-8"))["measurements"]
    assert m["command"]["ended"] == "interrupted" and m["command"]["processes_left"] == []
    assert m["step_time"]["steps"] >= 2
    assert process_tree(os.getpid()) - before == set()
