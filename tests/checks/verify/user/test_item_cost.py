"""A map-style dataset's cost split, as the command ran it (``checks/verify/user/itemcost.py``): a script whose
``__getitem__`` sleeps 4 ms (1 ms itself, 3 ms in the one step of its Compose-like transform) and whose collate
sleeps 10 ms a batch (``scripts/costly_items.py``) under ``verify --``, loading in the training process, then in
forked and in spawned workers (the agent runs in each worker, and times the transform in a sample of batches).

A sleep never ends early, so the planted times are lower bounds. The upper bounds leave a loaded 2-core box room:
there, with two workers, the training process and verify's sampler on the two cores, the script's own clock read
its 4 ms __getitem__ at a median of 4.2 ms but a mean of 5.1 ms (stalls up to 20 ms), and the agent 5.2-6.0 ms
over the measured steps (4.45 ms in the training process, 4.6 ms in spawned workers)."""

from __future__ import annotations

import functools
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checks.verify.diagnosis import Verdict, item_cost_text
from checks.verify.events import parse
from checks.verify.user.itemcost import REST, item_cost, split_fix, transform_split, with_split
from checks.verify.user.launch import SPLIT_ENV, SPLIT_EVERY
from tests.checks.verify.user.test_command import verify
from tests.fakes.verdicts import planted

GETITEM_MS, COLLATE_MS, BATCH = 4.0, 10.0, 8
TRANSFORM_MS = 3.0  # of the 4 ms: the rest is the read


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


agent = importlib.import_module("checks.verify.user.inject._gpu_preflight_agent")


class _Compose:
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class Blur:
    def __call__(self, x: Any) -> Any:
        time.sleep(0.002)
        return x


class _Photos:
    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __getitem__(self, i: int) -> Any:
        return self.transform(i)


class _Subset:
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset


class _OwnList:
    def __init__(self) -> None:
        self.transforms = [Blur()]


class _Stubborn(list[Any]):
    """A list that refuses a timing wrapper at index 1 (the swap fails half-way)."""

    def __setitem__(self, k: Any, v: Any) -> None:
        if k == 1 and isinstance(v, agent._Timed):
            raise TypeError("no")
        super().__setitem__(k, v)


def test_the_agent_finds_a_pipeline_times_its_steps_for_one_batch_and_puts_them_back() -> None:
    """``_Split``: the Compose-like list's steps swapped in place for timing wrappers, the originals back after."""
    steps = [Blur(), functools.partial(max, 0), abs]
    photos = _Photos(_Compose(steps))
    originals = list(steps)
    split = agent._Split.of(photos)
    assert (split.method, split.where, split.names) == ("compose", "_Photos.transform", ["Blur", "max", "abs"])
    assert photos.transform.transforms is steps and steps[0] is not originals[0]  # the same list, wrapped steps
    photos[3]
    split.put_back()
    assert steps == originals and split.spent[0] >= 0.002 and split.spent[0] > split.spent[1] + split.spent[2]
    assert agent._Split.of(_Subset(photos)).where == "_Photos.transform"  # one level into a wrapper
    assert agent._Split.of(_OwnList()).where == "_OwnList.transforms"  # the dataset's own list
    one = _Photos(abs)
    single = agent._Split.of(one)
    assert (single.method, single.names) == ("transform", ["abs"]) and one.transform is not abs
    single.put_back()
    assert one.transform is abs and agent._Split.of(_Photos(None)) is None
    stubborn = _Stubborn([abs, abs])
    assert agent._Split.of(_Photos(_Compose(stubborn))) is None and stubborn == [abs, abs]  # the first put back


def test_the_agent_times_every_nth_batch_from_the_second() -> None:
    assert agent.SPLIT_ENV == SPLIT_ENV  # the agent reads what verify sets
    sampled = agent._Sampled(SPLIT_EVERY)
    assert [n for n in range(1, 10) if sampled.due()] == [2, 5, 8]
    assert all(agent._Sampled(1).due() for _ in range(3))


def _transforms(pid: int, ppid: int, feed: str, seconds: tuple[float, ...], getitem_s: float) -> Any:
    line = {"event": "transforms", "t": 11.0, "pid": pid, "ppid": ppid, "feed": feed, "worker": 0, "samples": 8}
    line |= {"getitem_s": getitem_s, "method": "compose", "where": "Photos.transform"}
    return parse(line | {"names": ["ColorJitter", "GaussianBlur", "Resize"], "seconds": list(seconds)})


def test_the_split_is_each_transforms_share_of_a_samples_time_and_the_rest_is_read_and_decode() -> None:
    """The parent's split of the agent's ``transforms`` lines: the training process's and its workers' lines of
    the loader its steps read, summed per step; what the steps leave of ``__getitem__`` is read + decode."""
    step = {"event": "step", "t": 0.0, "pid": 7, "data_wait": 0.5, "h2d": 0.0, "forward": 0.5, "backward": 0.0}
    step |= {"optimizer": 0.0, "enqueue_s": 0.0, "samples": 8, "batches": 1, "feed": "data:1", "i": 1}
    lead = _Lead(7, [parse(step | {"host_start": 10.0, "host_end": 11.0})])
    lines = [
        _transforms(9, 7, "data:1", (0.02, 0.10, 0.01), 0.16),  # a worker of the training process
        _transforms(7, 1, "data:1", (0.02, 0.14, 0.03), 0.24),  # the training process itself
        _transforms(9, 7, "data:2", (1.0, 0.0, 0.0), 1.1),  # another loader (an eval set's)
        _transforms(12, 8, "data:1", (1.0, 0.0, 0.0), 1.1),  # another process's worker
    ]
    split = transform_split(lead, lines)
    assert split is not None and split["samples"] == 16 and split["batches"] == 2
    assert split["pipeline"] == "Photos.transform" and split["ms_per_sample"] == pytest.approx(25.0)
    shares = {p["name"]: p["share"] for p in split["parts"]}
    assert shares == pytest.approx({"GaussianBlur": 0.6, "ColorJitter": 0.1, "Resize": 0.1, REST: 0.2})
    assert split["parts"][0]["name"] == "GaussianBlur"
    # Staged ahead by stage-data: the read + decode, and a fixed resize only where it comes first (after a random
    # ColorJitter here, it stays per sample)
    assert {p["name"] for p in split["parts"] if p["staged"]} == {REST}
    first = [line.to_json() | {"names": ["Resize", "ColorJitter", "GaussianBlur"]} for line in lines]
    resized = transform_split(lead, [e for e in map(parse, first) if e is not None])
    assert resized is not None and {p["name"] for p in resized["parts"] if p["staged"]} == {REST, "Resize"}
    assert transform_split(_Lead(9, lead.steps), lines) is not None  # the worker's own lines
    assert transform_split(_Lead(5, lead.steps), lines) is None  # none of its processes timed a transform


def test_the_fix_names_the_costliest_transform_and_what_pre_decoding_would_remove_as_an_estimate() -> None:
    parts = [
        {"name": "GaussianBlur", "ms": 15.0, "share": 0.6},
        {"name": REST, "ms": 5.0, "share": 0.2, "staged": True},
    ]
    parts += [
        {"name": "Resize", "ms": 2.5, "share": 0.1, "staged": True},
        {"name": "ColorJitter", "ms": 2.5, "share": 0.1},
    ]
    split = {"method": "compose", "pipeline": "Photos.transform", "batches": 2, "samples": 16}
    split |= {"ms_per_sample": 25.0, "parts": parts}
    fix = split_fix(split)
    assert fix.startswith("where a sample's 25.0 ms go (Photos.transform, 16 samples timed): GaussianBlur 60%, ")
    assert "GaussianBlur is the costliest transform (60%, 15.00 ms a sample)" in fix
    assert fix.endswith(
        "pre-decoding with invoke stage-data (decoded, resized arrays) removes read + decode and Resize: about 30% "
        "of a sample's time (an estimate from these shares, not measured)"
    )
    small = split | {"parts": [parts[0] | {"share": 0.85}, parts[1] | {"share": 0.05}, parts[3] | {"share": 0.1}]}
    assert split_fix(small).endswith(
        "pre-decoding with invoke stage-data would remove only read + decode (5%: an estimate)"
    )
    decode = split | {"parts": [parts[1] | {"share": 0.7}, parts[0] | {"share": 0.3}]}
    text = split_fix(decode)
    assert text.index("removes read + decode: about 70%") < text.index("GaussianBlur is the costliest transform (30%")
    data = Verdict(
        "data-bound", "warn", "medium", "waits", "--workers 2: measured", 0.5, {"item_cost": {"split": split}}
    )
    other = Verdict("compute-bound", "info", "high", "busy", "none", 0.0, {"item_cost": {"split": split}})
    out = with_split([data, other, Verdict("data-bound", "warn", "low", "waits", "more workers", 0.5, {})])
    assert out[0].fix == f"--workers 2: measured; {fix}" and out[1] == other and out[2].fix == "more workers"


def check_split(judged_m: dict, summary: str, where: str) -> dict:
    c = judged_m["item_cost"]
    assert c["where"] == where and c["samples_per_step"] == BATCH and c["batches_per_step"] == 1
    assert GETITEM_MS <= c["getitem_ms_per_sample"] <= 2.5 * GETITEM_MS, c
    assert COLLATE_MS <= c["collate_ms_per_batch"] <= 2 * COLLATE_MS, c  # not the batch's 8 x 4 ms of samples
    assert c["getitem_ms_per_step"] == pytest.approx(BATCH * c["getitem_ms_per_sample"], rel=1e-3)
    assert f"each sample takes {c['getitem_ms_per_sample']:.2f} ms in __getitem__ (8 per step = " in summary
    assert f"collate {c['collate_ms_per_batch']:.2f} ms a batch" in summary
    split = c["split"]  # a sample of the batches, in whichever process built them: the sleeps' shares
    assert split["pipeline"] == "Costly.transform" and split["samples"] >= BATCH, split
    shares = {p["name"]: p["share"] for p in split["parts"]}
    assert set(shares) == {"Tokenize", REST} and 0.55 <= shares["Tokenize"] <= 0.9, split
    assert TRANSFORM_MS <= split["parts"][0]["ms"] <= 2.5 * TRANSFORM_MS and split["parts"][0]["name"] == "Tokenize"
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
