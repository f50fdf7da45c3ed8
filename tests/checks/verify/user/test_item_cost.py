"""A map-style dataset's cost split, as the command ran it (``checks/verify/user/itemcost.py``): a script whose
``__getitem__`` sleeps 4 ms and whose collate sleeps 10 ms a batch (``scripts/costly_items.py``) under ``verify --``,
loading in the training process, then in forked and in spawned workers (the agent runs in each worker).

A sleep never ends early, so the planted times are lower bounds. The upper bounds leave a loaded 2-core box room:
there, with two workers, the training process and verify's sampler on the two cores, the script's own clock read
its 4 ms __getitem__ at a median of 4.2 ms but a mean of 5.1 ms (stalls up to 20 ms), and the agent 5.2-6.0 ms
over the measured steps (4.45 ms in the training process, 4.6 ms in spawned workers)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from checks.verify.diagnosis import item_cost_text
from checks.verify.events import parse
from checks.verify.user.itemcost import item_cost
from tests.checks.verify.user.test_command import verify
from tests.fakes.verdicts import planted

GETITEM_MS, COLLATE_MS, BATCH = 4.0, 10.0, 8


def test_the_verdict_text_names_the_per_sample_and_per_batch_cost() -> None:
    c = {"getitem_ms_per_sample": 4.4523, "getitem_ms_per_step": 35.618, "samples_per_step": 8,
         "collate_ms_per_batch": 10.9766, "workers": 0}  # fmt: skip
    assert (
        item_cost_text(c) == "each sample takes 4.45 ms in __getitem__ (8 per step = 35.6 ms), collate 10.98 ms a batch"
    )
    text = item_cost_text(c | {"workers": 2})
    assert text.endswith("(timed in the 2 workers, which share that work)")


class _Lead:
    def __init__(self, pid: int, steps: list[Any]) -> None:
        self.pid, self.steps = pid, steps


def test_worker_lines_are_the_training_process_children_during_the_measured_steps() -> None:
    step = {"event": "step", "t": 0.0, "pid": 7, "data_wait": 0.5, "h2d": 0.0, "forward": 0.5, "backward": 0.0}
    step |= {"optimizer": 0.0, "enqueue_s": 0.0, "samples": 8, "batches": 1, "feed": "data:1"}
    steps = [parse(step | {"i": i, "host_start": 10.0 + i, "host_end": 11.0 + i}) for i in range(3)]
    line = {"event": "fetch", "pid": 9, "ppid": 7, "feed": "data:1", "worker": 0, "workers": 2, "samples": 8}
    line |= {"collate_s": 0.01}
    lines = [line | {"t": 10.5, "getitem_s": 0.032}, line | {"t": 12.5, "getitem_s": 0.040},
             line | {"t": 5.0, "getitem_s": 1.0},  # before the measured steps: a warm-up batch
             line | {"t": 11.0, "ppid": 8, "getitem_s": 1.0}]  # another process's worker  # fmt: skip
    events = [e for e in map(parse, lines) if e is not None]
    c = item_cost(_Lead(7, steps), events)
    assert c is not None and c["where"] == "workers" and c["batches"] == 2 and c["workers"] == 2
    assert c["getitem_ms_per_sample"] == pytest.approx(4.5) and c["collate_ms_per_batch"] == pytest.approx(10.0)
    assert item_cost(_Lead(9, steps), events) is None  # no map-style batch timed: no figure


def check_split(judged_m: dict, summary: str, where: str) -> dict:
    c = judged_m["item_cost"]
    assert c["where"] == where and c["samples_per_step"] == BATCH and c["batches_per_step"] == 1
    assert GETITEM_MS <= c["getitem_ms_per_sample"] <= 2.5 * GETITEM_MS, c
    assert COLLATE_MS <= c["collate_ms_per_batch"] <= 2 * COLLATE_MS, c  # not the batch's 8 x 4 ms of samples
    assert c["getitem_ms_per_step"] == pytest.approx(BATCH * c["getitem_ms_per_sample"], rel=1e-3)
    assert f"each sample takes {c['getitem_ms_per_sample']:.2f} ms in __getitem__ (8 per step = " in summary
    assert f"collate {c['collate_ms_per_batch']:.2f} ms a batch" in summary
    return c


@pytest.mark.slow
def test_loading_in_the_training_process(tmp_path: Path) -> None:
    judged = verify(tmp_path, sys.executable, "costly_items.py")
    m = judged.report.measurements
    v = planted(judged.verdicts)
    assert v.id in ("data-bound", "cpu-starved") and v.evidence["item_cost"] == m["item_cost"]
    c = check_split(m, v.summary, "training process")
    # Both parts ran inside the data wait, one after the other: together they fit in it.
    wait_ms = 1e3 * m["step_time"]["mean_s"] * m["step_breakdown"]["data_wait"]
    assert c["getitem_ms_per_step"] + c["collate_ms_per_step"] <= wait_ms * 1.001


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_loading_in_workers(tmp_path: Path, start: str) -> None:
    judged = verify(tmp_path, sys.executable, "costly_items.py", "--workers", "2", "--start", start)
    m = judged.report.measurements
    v = planted(judged.verdicts)
    assert v.id in ("data-bound", "cpu-starved")
    c = check_split(m, v.summary, "workers")
    assert c["workers"] == 2 and v.summary.endswith("(timed in the 2 workers, which share that work)")
