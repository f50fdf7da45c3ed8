"""The one launcher and teardown of every child: its own session, the signal ladder, the subreaper's clean-up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from checks.probe import session
from checks.probe.sample import process_exists

# A child that ignores SIGINT and starts a grandchild in a session of its own (as torchrun starts its ranks): a
# signal to the child's group never reaches the grandchild.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print(kid.pid, flush=True)
time.sleep(60)
"""


def test_the_ladder_goes_on_to_the_next_signal_and_the_reaper_kills_the_orphan(tmp_path: Path) -> None:
    with session.Reaper() as reaper:
        proc = session.start([sys.executable, "-c", STUBBORN], str(tmp_path), None, subprocess.PIPE, None)
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        sent: list[str] = []
        started = time.monotonic()
        session.stop_group(proc, ((signal.SIGINT, 0.5), (signal.SIGTERM, 5.0)), sent)
        assert sent == ["SIGINT", "SIGTERM"] and proc.returncode == -signal.SIGTERM
        assert time.monotonic() - started < 5
        assert process_exists(grandchild)  # in a session of its own: no group signal reached it
        leftovers, left = reaper.clean_up({proc.pid})
    assert grandchild in leftovers and left == []
    assert not process_exists(grandchild)


def test_an_empty_ladder_kills_at_once_and_a_child_gone_is_left_alone(tmp_path: Path) -> None:
    proc = session.start([sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path), None, None, None)
    sent: list[str] = []
    session.stop_group(proc, (), sent)
    assert sent == ["SIGKILL"] and proc.returncode == -signal.SIGKILL
    session.stop_group(proc, (), sent)  # already reaped: nothing sent
    assert sent == ["SIGKILL"]
