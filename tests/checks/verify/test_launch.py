"""The one launcher for 1 and N processes, with a stand-in child (no torch): events, results, failures, stalls.

The stand-in speaks the contract as the training child does: it reads its ``RunSpec``, appends event lines and
writes a ``ChildResult``; what it does is chosen by the spec's ``model`` field (``ok``, ``crash-rank1``,
``hang-rank1``, ``garbage``, ``badevent``), so the launcher's real code path runs in well under a second per case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from checks.verify.contract import DdpSpec, PhaseEvent, RunSpec, StepEvent
from checks.verify.smoke import launch as launcher
from tests.checks.verify.verify_cases import SPEC

pytestmark = pytest.mark.slow  # real processes (stand-ins, no torch): 1-2 s each, the stall case ~6 s

STAND_IN = """
import json, os, sys, time
from pathlib import Path
if "TORCHELASTIC_RUN_ID" in os.environ:  # as the training child does under torchrun: output to rankN.log
    fd = os.open(f"rank{os.environ['LOCAL_RANK']}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1), os.dup2(fd, 2)
spec = json.loads(Path(sys.argv[1]).read_text())
rank = (spec.get("ddp") or {}).get("rank", 0)
how = spec["model"]
if os.environ.get("STAND_IN_PIDS"):
    Path(os.environ["STAND_IN_PIDS"], str(os.getpid())).touch()
print("started by", "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "verify", "as rank",
      os.environ.get("RANK", rank), "of", os.environ.get("WORLD_SIZE", 1), flush=True)
events = open(spec["events"], "a", buffering=1)
events.write(json.dumps({"event": "phase", "t": 1.0, "phase": "measure"}) + "\\n")
if how == "badevent":
    events.write(json.dumps({"event": "progress", "t": 1.0, "done": 0.5}) + "\\n")
if how == "hang-rank1" and rank == 1:
    time.sleep(60)
if how == "crash-rank1-early" and rank == 1:
    sys.exit(1)  # before any event: possibly before verify ever saw this rank's process
if how == "crash-rank1-early":
    time.sleep(10)  # torchrun stops this rank (SIGTERM) once it sees rank 1's failure: no result either
if how == "crash-rank1" and rank == 1:
    print("RuntimeError: planted on rank 1")
    sys.exit(1)
for i in range(3):
    events.write(json.dumps({"event": "step", "t": 1.0, "phase": "measure", "i": i + 1, "of": 3}) + "\\n")
    time.sleep(0.05)
if how == "hang-rank1":
    time.sleep(60)  # rank 0 waits for its peer in the next all-reduce
step = {"data_wait": 0.01, "h2d": 0.0, "forward": 0.02, "backward": 0.04, "optimizer": 0.01}
result = {"steps": [step] * 3, "batch_size": 4, "device": {"type": "cpu", "name": "cpu"}}
if spec.get("ddp"):
    result["ddp"] = {"rank": rank, "world_size": spec["ddp"]["world_size"], "backend": "gloo"}
if how == "garbage":
    result["stepz"] = []
Path(spec["result"]).write_text(json.dumps(result))
"""


@pytest.fixture()
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(launcher, "SCRIPT", script)
    return script


def spec(how: str, world: int = 1) -> RunSpec:
    ddp = DdpSpec(world, "gloo") if world > 1 else None
    return dataclasses.replace(SPEC, model=how, ddp=ddp)


def test_one_process_is_a_run_of_one_rank_without_a_ranks_list(stand_in: Path) -> None:
    seen: list[object] = []
    pids: list[int] = []
    run = launcher.launch(spec("ok"), 30, 10, seen.append, pids.append, sys.executable)
    assert run.failure is None and run.rank is None and run.result is not None
    assert "started by verify as rank 0 of 1" in run.log_tail  # one process needs no torchrun
    assert len(run.result.steps) == 3 and run.result.ranks == () and run.result.ddp is None
    assert seen[0] == PhaseEvent("measure", 1.0) and StepEvent("measure", 3, 3, 1.0) in seen
    assert len(pids) == 1 and _gone(pids[0])


def test_two_ranks_come_back_as_rank_0s_result_with_both_ranks(stand_in: Path) -> None:
    run = launcher.launch(spec("ok", world=2), 30, 10, python=sys.executable)
    assert run.failure is None and run.result is not None
    assert "started by torchrun as rank 0 of 2" in run.log_tail  # torchrun started the ranks, not verify
    assert [r.rank for r in run.result.ranks] == [0, 1] and all(len(r.steps) == 3 for r in run.result.ranks)
    assert run.result.ddp is not None and run.result.ddp.world_size == 2


def test_a_rank_that_exits_without_a_result_stops_the_run_and_is_named(stand_in: Path) -> None:
    pids: list[int] = []
    run = launcher.launch(spec("crash-rank1", world=2), 30, 10, on_start=pids.append, python=sys.executable)
    assert (run.failure, run.rank) == ("crashed", 1)
    assert run.result is not None and run.result.error == "rank 1: crashed: exit without a result"
    assert "planted on rank 1" in run.log_tail  # the failed rank's own output, not rank 0's
    assert _gone(pids[0])


def test_a_rank_that_fails_at_once_is_named_not_the_peer_torchrun_stopped_after_it(stand_in: Path) -> None:
    run = launcher.launch(spec("crash-rank1-early", world=2), 30, 10, python=sys.executable)
    assert (run.failure, run.rank) == ("crashed", 1), run.log_tail
    assert run.seconds < 8  # torchrun stopped rank 0; verify did not wait out its sleep


def test_a_silent_rank_stalls_the_run_and_the_one_that_lags_is_named(stand_in: Path, tmp_path: Path) -> None:
    pids: list[int] = []
    ranks = tmp_path / "pids"
    ranks.mkdir()
    env = {"STAND_IN_PIDS": str(ranks)}
    run = launcher.launch(spec("hang-rank1", world=2), 30, 5.0, on_start=pids.append, extra_env=env)
    assert (run.failure, run.rank) == ("stalled", 1)
    assert _gone(pids[0])  # torchrun and its group were killed
    started = [int(p.name) for p in ranks.iterdir()]
    assert len(started) == 2 and all(_gone(p) for p in started)  # so were both ranks, each in a session of its own


def test_a_result_file_that_is_not_a_child_result_is_a_crash_that_says_why(stand_in: Path) -> None:
    run = launcher.launch(spec("garbage"), 30, 10, python=sys.executable)
    assert run.result is None and run.failure == "crashed"
    assert "result.0.json is not a child result: ChildResult: unknown key 'stepz'" in run.log_tail


def test_a_line_that_is_no_event_is_left_out_and_said_in_the_log(stand_in: Path) -> None:
    seen: list[object] = []
    run = launcher.launch(spec("badevent"), 30, 10, seen.append, python=sys.executable)
    assert run.failure is None and run.result is not None and len(seen) == 4  # the phase and three steps
    assert "1 event line(s) were not events: event: unknown kind 'progress'" in run.log_tail


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_spec_each_rank_reads_names_its_files_and_rendezvous(tmp_path: Path) -> None:
    node = launcher.Node("10.0.0.1", 29400, first=2, local=2, index=1, nodes=2)
    mine = launcher._rank_spec(spec("ok", world=4), node, 1, tmp_path)
    assert mine.ddp is not None and (mine.ddp.rank, mine.ddp.local_rank, mine.ddp.nodes) == (3, 1, 2)
    assert (mine.ddp.addr, mine.ddp.port) == ("10.0.0.1", 29400)
    assert (Path(mine.events).name, Path(mine.result).name) == ("events.1.jsonl", "result.1.json")
    assert json.loads(json.dumps(mine.to_json()))["ddp"]["rank"] == 3
