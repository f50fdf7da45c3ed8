"""A command under torchrun that fails shows the rank's own error in its verify-command row, not torchrun's table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]  # at tests/checks/verify/user/
BAD = """\
import torch
opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
raise ValueError("my own error: no data in /nope")
"""


@pytest.mark.slow
def test_a_failed_command_under_torchrun_shows_the_ranks_own_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    out = tmp_path / "v.json"
    argv = [sys.executable, "-m", "invoke", "-r", str(REPO), "verify", "--json", str(out), "--",
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--no-python",
            sys.executable, "bad.py"]  # fmt: skip
    env = os.environ | {"HOME": str(tmp_path), "INVOKE_PREFLIGHT_VERIFY_STEPS": "4"}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    row = next(r for r in json.loads(out.read_text())["results"] if r["id"] == "verify-command")
    assert row["status"] == "fail" and row["summary"].endswith("ValueError: my own error: no data in /nope"), row
    assert "Root Cause" not in row["hint"] and 'raise ValueError("my own error' in row["hint"], row["hint"]


def test_own_stderr_drops_torchruns_failure_report() -> None:
    from checks.verify.user.launch import own_stderr

    rank = ["Traceback (most recent call last):", '  File "bad.py", line 3, in <module>', "ValueError: mine"]
    agent = ["Traceback (most recent call last):", '  File "run.py", line 9, in main',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60, "bad.py FAILED",
             "Root Cause (first observed failure):", "  exitcode  : 1 (pid: 8334)", "=" * 60]  # fmt: skip
    assert own_stderr(rank + agent) == rank
    cant = ["python: can't open file '/x/train.py': [Errno 2] No such file or directory"]
    assert own_stderr(cant + agent) == cant
    assert own_stderr(rank) == rank and own_stderr(agent) == agent


def test_the_rank_that_failed_first_is_quoted_not_the_peer_it_took_down() -> None:
    """Rank 1 raises; rank 0's gloo exchange then fails on the closed connection (its traceback comes after);
    torchrun's table names rank 1: its traceback, to its error line, is the one quoted."""
    from checks.verify.user.launch import CommandRun

    first = ["Traceback (most recent call last):", '  File "train.py", line 40, in forward',
             "RuntimeError: planted failure on rank 1", "  (a line after the error)"]  # fmt: skip
    peer = ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
            "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"]  # fmt: skip
    table = ["Traceback (most recent call last):", '  File "run.py", line 9, in main',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
             "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
             "  exitcode  : 1 (pid: 8334)", "=" * 60]  # fmt: skip
    run = CommandRun(argv=("torchrun", "train.py"), stderr_tail=first + peer + table)
    assert run.failed_rank() == 1
    assert run.traceback() == first[:3]
    alone = CommandRun(argv=("python", "train.py"), stderr_tail=peer + first[:3])  # no torchrun: the last one
    assert alone.failed_rank() is None and alone.traceback()[-1] == "RuntimeError: planted failure on rank 1"


def test_a_ranks_own_lines_are_read_where_torch_prefixes_them() -> None:
    from checks.verify.user.launch import CommandRun

    tail = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 40, in forward',
            "[rank0]: Traceback (most recent call last):", "[rank1]: RuntimeError: planted failure on rank 1",
            "[rank0]: RuntimeError: Connection closed by peer", "Root Cause (first observed failure):",
            "  rank      : 1 (local_rank: 1)"]  # fmt: skip
    run = CommandRun(argv=("torchrun", "train.py"), stderr_tail=tail)
    assert run.traceback()[-1] == "RuntimeError: planted failure on rank 1", run.traceback()


def test_the_rank_with_its_own_error_is_named_when_torchrun_saw_its_peer_fail_first() -> None:
    """torchrun's table names the rank it saw exit first, which can be the peer that lost the failed rank."""
    from checks.verify.user.launch import CommandRun

    tail = ["[rank1]: Traceback (most recent call last):", "[rank1]: RuntimeError: planted failure on rank 1",
            "[rank0]: Traceback (most recent call last):",
            "[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:65202",
            "Root Cause (first observed failure):", "  rank      : 0 (local_rank: 0)"]  # fmt: skip
    run = CommandRun(argv=("torchrun", "train.py"), stderr_tail=tail)
    assert run.failed_rank() == 1
    assert run.traceback()[-1] == "RuntimeError: planted failure on rank 1", run.traceback()
