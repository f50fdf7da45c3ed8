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
LOST: dict[str, Any] = {"failure": "crashed", "rank": 0, "result": {"error": PEER_GONE}}
RAISED: dict[str, Any] = {
    "failure": "crashed",
    "rank": 1,
    "result": {"error": "RuntimeError: planted failure on rank 1"},
}
KILLED: dict[str, Any] = {
    "result": None,
    "failure": "killed",
    "interrupted": True,
}  # what a node stopped by the controller returns


def _hosts(*names: str) -> list[h.Host]:
    return [h.Host(ready=SimpleNamespace(spec=SimpleNamespace(name=n)), probe={}) for n in names]


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
    child = h.combine(hosts, runs, order, interrupted, by_us)
    assert child.rank == 1 and child.result is not None
    assert child.result.error == "RuntimeError: planted failure on rank 1 (on h2)"


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
    child = h.combine(hosts, runs, order, interrupted, by_us)
    # h2's "killed" is the stop, not a cause: the lost peer is all that is known, and it is said as such.
    assert child.failure == "crashed" and child.rank == 0 and child.result is not None
    assert child.result.error == f"{PEER_GONE} (on h1)"


def test_a_host_that_raised_stops_the_others_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _replay(monkeypatch, {"h1": (60.0, LOST), "h2": (0.05, RAISED)})
    hosts, said = _hosts("h1", "h2"), list[str]()
    began = time.monotonic()
    runs, order, interrupted, by_us = h.run_nodes(hosts, [b"", b""], 30, said.append)
    assert stopped == ["h1"] and by_us == {0} and time.monotonic() - began < 2
    assert said == ["verify: h2 failed: stopping the other hosts' ranks"]
    child = h.combine(hosts, runs, order, interrupted, by_us)
    assert child.rank == 1 and child.result is not None and str(child.result.error).endswith("(on h2)")
