"""``verify --hosts``: which host's failure is the cause, when one rank raised and its peer on another host only lost
the connection. The hosts' runs are replayed in threads (``_run_node`` and ``_stop_all`` replaced): what is tested is
the controller's order of reports and stops, which the real-host tests (test_hosts.py) reach only by chance of load.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from checks.verify import hosts as h

PEER_GONE = "RuntimeError: Connection closed by peer [10.0.0.2]:29500"
ROOT_CAUSE = ["Failures:", "[1]:", "  rank      : 7 (local_rank: 3)", "Root Cause (first observed failure):", "[0]:"]


def _crashed(rank: int, error: str) -> dict[str, Any]:
    """A node whose torchrun job crashed (``checks.verify.user.node run``): the rank's traceback, then torchrun's
    failure report naming the rank."""
    tail = ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>', error]
    agent = ["Traceback (most recent call last):", '  File "/venv/bin/torchrun", line 8, in <module>']
    report = [*agent, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", *ROOT_CAUSE]
    return {"ended": "crashed", "returncode": 1, "events": [], "stderr_tail": [*tail, *report, f"  rank      : {rank}"]}


LOST = _crashed(0, PEER_GONE)
RAISED = _crashed(1, "RuntimeError: planted failure on rank 1")
KILLED: dict[str, Any] = {"ended": "interrupted", "interrupted": True, "returncode": -15, "events": []}  # stopped here


def _hosts(*names: str) -> list[h.Host]:
    return [h.Host(ready=SimpleNamespace(spec=SimpleNamespace(name=n)), probe={}) for n in names]


def test_a_torchrun_command_loses_its_node_flags_and_keeps_the_rest() -> None:
    argv = ["torchrun", "--standalone", "--nproc_per_node=4", "--rdzv-backend", "c10d", "--max-restarts", "2"]
    assert h.torchrun_parts([*argv, "train.py", "--lr", "0.1"]) == (
        ["--max-restarts", "2"],
        ["train.py", "--lr", "0.1"],
    )
    python = ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank=1", "-m", "pkg.train", "--x"]
    assert h.torchrun_parts(python) == (["-m"], ["pkg.train", "--x"])


@pytest.mark.parametrize("argv", [["python", "train.py"], ["torchrun", "--standalone"], ["deepspeed", "train.py"]])
def test_a_command_that_is_not_torchrun_is_exit_2(argv: list[str]) -> None:
    with pytest.raises(h.PreflightError) as got:
        h.torchrun_parts(argv)
    assert got.value.code == 2


def _replay(monkeypatch: pytest.MonkeyPatch, plan: dict[str, tuple[float, dict[str, Any]]]) -> list[str]:
    """Each host ends after its delay with its run, or as KILLED once it is stopped; returns the stop order."""
    stops: dict[str, threading.Event] = {name: threading.Event() for name in plan}
    stopped: list[str] = []

    def run_node(host: h.Host, payload: bytes, timeout: float) -> dict[str, Any]:
        delay, got = plan[host.spec.name]
        return KILLED if stops[host.spec.name].wait(delay) else got

    def stop_all(hosts: list[h.Host]) -> None:
        for host in hosts:
            stopped.append(host.spec.name)
            stops[host.spec.name].set()

    monkeypatch.setattr(h, "_run_node", run_node)
    monkeypatch.setattr(h, "_stop_all", stop_all)
    return stopped


def test_a_lost_peer_reported_first_waits_for_the_host_that_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _replay(monkeypatch, {"h1": (0.05, LOST), "h2": (0.6, RAISED)})
    hosts, said = _hosts("h1", "h2"), list[str]()
    runs, order, interrupted, by_us = h.run_nodes(hosts, [b"", b""], 30, said.append)
    assert stopped == [] and by_us == set() and order == [0, 1]  # h2 was given the time to say why
    run, culprit = h.merge_named(
        [x.spec.name for x in hosts], runs, order, interrupted, by_us, ["torchrun", "train.py"]
    )
    assert culprit == h.Culprit("h2", 1, "RuntimeError: planted failure on rank 1")
    assert run.ended == "crashed" and run.traceback()[-1] == "RuntimeError: planted failure on rank 1"


def test_a_host_that_stays_silent_after_its_peer_was_lost_is_stopped_and_not_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(h, "PEER_GRACE_S", 0.3)
    stopped = _replay(monkeypatch, {"h1": (0.05, LOST), "h2": (60.0, RAISED)})
    hosts, said = _hosts("h1", "h2"), list[str]()
    began = time.monotonic()
    runs, order, interrupted, by_us = h.run_nodes(hosts, [b"", b""], 30, said.append)
    assert stopped == ["h2"] and by_us == {1} and 0.3 <= time.monotonic() - began < 5
    assert said == ["verify: h1 lost its peer: stopping the other hosts' ranks"]
    run, culprit = h.merge_named(
        [x.spec.name for x in hosts], runs, order, interrupted, by_us, ["torchrun", "train.py"]
    )
    # h2's "interrupted" is the stop, not a cause: the lost peer is all that is known, and it is said as such.
    assert run.ended == "crashed" and culprit == h.Culprit("h1", 0, PEER_GONE)


def test_a_host_that_raised_stops_the_others_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _replay(monkeypatch, {"h1": (60.0, LOST), "h2": (0.05, RAISED)})
    hosts, said = _hosts("h1", "h2"), list[str]()
    began = time.monotonic()
    runs, order, interrupted, by_us = h.run_nodes(hosts, [b"", b""], 30, said.append)
    assert stopped == ["h1"] and by_us == {0} and time.monotonic() - began < 2
    assert said == ["verify: h2 failed: stopping the other hosts' ranks"]
    run, culprit = h.merge_named(
        [x.spec.name for x in hosts], runs, order, interrupted, by_us, ["torchrun", "train.py"]
    )
    assert culprit is not None and (culprit.host, culprit.rank) == ("h2", 1) and run.ended == "crashed"
