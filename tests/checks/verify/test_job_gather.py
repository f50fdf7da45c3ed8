"""Node 0's view of a Slurm job's nodes after the run (``checks/verify/job.py``): a node with no record is named
with the reason, the exchange's own failure where it failed (not a wait that never happened). The real job runs in
tests/checks/fleet/test_slurm.py."""

from __future__ import annotations

import json

from checks.probe.launch import LaunchContext
from checks.verify import job

CTX = LaunchContext("slurm", 0, 0, 2, 1, 0, "n1", "127.0.0.1", 25000, "7", ("n1", "n2"))
OWN = {"node": "n1", "local": 1, "address": "127.0.0.1", "ended_at": 10.0, "run": {"events": []}}


def test_a_node_whose_record_came_is_named_and_ordered_by_when_it_ended() -> None:
    theirs = {"node": "n2", "local": 1, "address": "127.0.0.2", "ended_at": 9.0, "run": {"events": [], "seconds": 3}}
    names, runs, counts, addresses, order = job._gathered(CTX, {"1": json.dumps(theirs)}, OWN, 60.0, False)
    assert names == ["n1", "n2"] and counts == [1, 1] and addresses == ["127.0.0.1", "127.0.0.2"]
    assert runs[1] == {"events": [], "seconds": 3} and order == [1, 0]


def test_a_missing_node_is_named_with_the_exchanges_failure_where_it_failed() -> None:
    failed = "the exchange at 127.0.0.1:25001 failed (exit 1): RuntimeError: address already in use"
    _, runs, _, _, order = job._gathered(CTX, {}, OWN, 60.0, False, failed)
    assert runs[1]["error"] == f"no result from n2: {failed}" and order == [0, 1]
    _, runs, _, _, _ = job._gathered(CTX, {}, OWN, 60.0, False)  # the exchange ran: the wait is the reason
    assert runs[1]["error"].startswith("no result from n2 within 60 s after n1's run ended")
