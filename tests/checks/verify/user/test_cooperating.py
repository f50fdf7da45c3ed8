"""The marks a script may use to cooperate with verify, on real CPU torch: ``should_stop()`` ends the command
without a signal (its own exit code and last line), ``phase("eval")`` keeps an evaluation out of the step time
and reports it as its own row; ``templates/train.py`` under torchrun leaves its loop at one step on every rank."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.verify.events import PhaseLine, StepLine
from checks.verify.user.launch import StopRule, run_command
from tests.checks.verify.user.test_command import SCRIPTS, TORCHRUN_2, verify

pytestmark = pytest.mark.slow

TRAIN = Path(__file__).resolve().parents[4] / "templates" / "train.py"
SMALL = ("--data", "synthetic-tokens", "--seq-len", "32", "--batch-size", "8", "--size", "small", "--workers", "0")


def test_a_script_that_asks_should_stop_ends_itself_with_its_own_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("wb") as fh:
        run = run_command([sys.executable, "cooperating.py"], StopRule(warmup=2, steps=6), str(SCRIPTS), None, fh)
    assert (run.ended, run.stop_reason, run.returncode) == ("stopped", "steps", 0), run.stderr_tail
    assert run.stopped_by_verify and run.asked and run.signals == []  # no SIGINT was needed
    assert "left the loop at step" in out.read_text()
    assert run.left == []
    steps = [e for e in run.events if isinstance(e, StepLine)]
    # verify reads the step lines as the agent writes them, in batches (every 0.2 s, and not during an eval)
    assert 8 <= len(steps) <= 8 + 8


def test_time_in_a_phase_is_out_of_the_steps_and_its_own_row(tmp_path: Path) -> None:
    said: list[str] = []
    judged = verify(tmp_path, sys.executable, "cooperating.py", steps=8, warmup=2, said=said)
    rows = {r.id: r for r in judged.report.results}
    evals = re.search(r"eval (\d+)x", rows["verify-phases"].summary)  # every 4th step: 2 at least in 10 steps
    assert evals is not None and int(evals.group(1)) >= 2, rows["verify-phases"].summary
    assert rows["verify-phases"].value["eval"] >= 0.6
    m = judged.report.measurements
    assert m["step_time"]["median_s"] < 0.2  # 20 ms steps; the 0.3 s evaluations are not in them
    assert m["step_time"]["p95_s"] < 0.2
    assert "should_stop()" in rows["verify-command"].summary
    assert any("stopped itself" in line for line in said)
    assert m["command"]["exit_status"] == 0 and m["command"]["signals"] == []


def test_phase_lines_say_the_eval_and_the_steps_before_it(tmp_path: Path) -> None:
    run = run_command(
        [sys.executable, "cooperating.py"], StopRule(warmup=1, steps=8), str(SCRIPTS), None, subprocess.DEVNULL
    )
    evals = [e for e in run.events if isinstance(e, PhaseLine)]
    assert [e.step for e in evals][:2] == [4, 8] and all(e.name == "eval" and e.seconds >= 0.3 for e in evals)
    forwards = [e.forward for e in run.events if isinstance(e, StepLine) and e.i > 1]  # the first holds start-up
    assert max(forwards) < 0.2, forwards


def test_the_template_under_torchrun_leaves_its_loop_at_one_step_on_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    argv = [*TORCHRUN_2, str(TRAIN), *SMALL, "--steps", "100000", "--log-every", "1000"]
    with out.open("wb") as fh:
        run = run_command(argv, StopRule(warmup=2, steps=5), str(tmp_path), None, fh)
    assert (run.ended, run.returncode, run.signals) == ("stopped", 0, []), run.stderr_tail[-20:]
    counts: dict[int | str, int] = {}
    for e in run.events:
        if isinstance(e, StepLine):
            counts[e.key] = counts.get(e.key, 0) + 1
    assert len(counts) == 2 and len(set(counts.values())) == 1, counts  # both ranks took the same steps
    assert out.read_text().count(f"trained {counts[0]} steps") == 1  # rank 0's own last line
    assert run.left == []


def test_should_stop_reads_the_stop_file_at_most_every_50_ms_and_waits_for_its_step(tmp_path: Path) -> None:
    agent = importlib.import_module("checks.verify.user.inject._gpu_preflight_agent")
    ask = agent._Ask(str(tmp_path))
    assert ask() is False and list(tmp_path.glob("listening-*"))  # the first call says the script listens
    (tmp_path / "stop").write_text(json.dumps({"at": 0}))
    assert ask() is False  # read less than STOP_READ_S ago: not read again yet
    time.sleep(agent.STOP_READ_S + 0.01)
    assert ask() is True
    later = agent._Ask(str(tmp_path))
    (tmp_path / "stop").write_text(json.dumps({"at": 3}))  # under torchrun: at the third step (none done here)
    assert later() is False
    assert agent.should_stop() is False  # not armed (outside verify): always False
