"""Which DataLoader settings the loader advice times (``checks/verify/user/advice.py``), and how a re-run's steps
are read: fewer workers where the loader has more than the cores or the hand-off is the wait, the tool's own
script advised by its ``--workers`` flag, and a re-run's steps that read batches its workers made before them
(while the script started) left out of its mean, so a short re-run cannot claim a gain the cores cannot give.

The re-runs here are scripted; real ones are in tests/checks/verify/test_planted_advice.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from checks.verify.events import Event, FetchLine, StepLine, parse
from checks.verify.user import advice
from checks.verify.user.launch import CommandRun


def step(i: int, start: float, seconds: float, batches: int = 1, pid: int = 10) -> StepLine:
    line = {"event": "step", "t": start + seconds, "pid": pid, "i": i, "data_wait": seconds - 0.001, "h2d": 0.0}
    line |= {"forward": 0.001, "backward": 0.0, "optimizer": 0.0, "host_start": start, "host_end": start + seconds}
    line |= {"enqueue_s": 0.0, "batches": batches, "samples": 16 * batches, "feed": "data:1", "micro": 1}
    got = parse(line)
    assert isinstance(got, StepLine)
    return got


def made(t: float, ppid: int = 10, workers: int = 16, getitem_s: float = 0.16) -> FetchLine:
    line = {"event": "fetch", "t": t, "pid": 99, "feed": "data:1", "ppid": ppid, "worker": 0, "workers": workers}
    got = parse(line | {"samples": 16, "getitem_s": getitem_s, "collate_s": 0.001})
    assert isinstance(got, FetchLine)
    return got


ITEM = {"where": "workers", "getitem_ms_per_step": 1.5, "collate_ms_per_step": 2.0, "batches_per_step": 1}


def counts(settings: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return [(s["num_workers"], s.get("prefetch_factor")) for s in settings]


def test_more_workers_than_cores_tries_one_per_core_first() -> None:
    got = advice.candidates({"num_workers": 8}, 2.0, False, None, 0.05)
    assert counts(got) == [(2, None), (16, None), (9, None), (16, 4)]
    assert got[0] == {"num_workers": 2, "persistent_workers": True}


def test_a_wait_longer_than_the_workers_took_to_make_the_batch_tries_no_workers() -> None:
    """2 workers, 3.5 ms of __getitem__ and collate a step, 20 ms waited: the hand-off is the wait."""
    got = advice.candidates({"num_workers": 2}, 2.0, False, ITEM, 0.020)
    assert counts(got)[0] == (0, None) and got[0] == {"num_workers": 0, "persistent_workers": False}
    # the batches took longer to make than the step waited: the workers are doing the work, more may help
    assert 0 not in [n for n, _ in counts(advice.candidates({"num_workers": 2}, 2.0, False, ITEM, 0.002))]
    # made in the training process (no workers to hand off from): nothing fewer
    assert counts(advice.candidates({"num_workers": 0}, 2.0, False, ITEM | {"where": "training process"}, 0.02)) == [
        (2, None),
        (1, None),
        (2, 4),
    ]


def test_the_tools_own_script_is_advised_by_its_workers_flag_and_times_no_prefetch() -> None:
    got = advice.candidates({"num_workers": 0}, 2.0, True, None, 0.0, "--workers")
    assert counts(got) == [(2, None), (1, None)] and all(s["pin_memory"] for s in got)
    assert advice.change(got[0], {"num_workers": 0}, "templates/train.py:418", "--workers") == "--workers 2"
    assert advice.change(got[0], {"num_workers": 0}, "t.py:9") == (
        "DataLoader(..., num_workers=2, persistent_workers=True, pin_memory=True) at t.py:9"
    )


def run_of(events: Sequence[Event]) -> CommandRun:
    return CommandRun(argv=("python",), events=list(events), ended="stopped")


def test_steps_that_read_the_queue_down_are_timed_at_the_pace_the_workers_made_batches() -> None:
    """16 workers made 12 batches during start-up (t < 1); 2 warm-up steps read 2, the next 10 steps (10 ms each)
    read the rest, and from then on a batch takes the 2 cores 80 ms (16 x 10 ms of CPU): over 16 measured steps
    the steps' mean is 35 ms, the workers made a batch every 80 ms: the re-run is 80 ms a step."""
    events: list[Event] = [made(0.5 + 0.01 * k) for k in range(12)]
    t, steps = 1.0, []
    for i in range(1, 19):
        seconds = 0.01 if i <= 12 else 0.08
        steps.append(step(i, t, seconds))
        if i > 12:
            events.append(made(t + seconds - 0.001))
        t += seconds
    got = advice.steady(run_of([*events, *steps]), 2, 16)
    assert got.capped_from_s == pytest.approx((10 * 0.01 + 6 * 0.08) / 16)
    assert got.step_s == got.workers_step_s == pytest.approx(0.08)
    # 8 measured steps of 10 ms, all of them read from the start-up's queue, no batch made in their 80 ms: at
    # least 80 ms a batch (the bench's "5.71x" was steps like these)
    got = advice.steady(run_of([*events, *steps]), 2, 8)
    assert got.capped_from_s == pytest.approx(0.01) and got.step_s == pytest.approx(0.08)
    # no workers' lines (the training process made each batch, or an iterable dataset): the steps' own mean
    got = advice.steady(run_of(steps), 2, 16)
    assert got.workers_step_s is None and got.step_s == pytest.approx((10 * 0.01 + 6 * 0.08) / 16)


def test_workers_that_make_their_batches_in_bursts_are_timed_by_how_long_one_takes_them() -> None:
    """Eight workers on 2 cores, 160 ms of CPU a batch: all eight finish together every 640 ms. Eight measured
    steps: one waits 400 ms for a burst, seven read it in 5 ms each: 55 ms a step, a rate of 8 batches within
    7 ms. Each batch took its worker 640 ms, eight at once: 80 ms a step is what they sustain."""

    def burst(t: float) -> list[Event]:
        return [made(t + 0.001 * k, workers=8, getitem_s=0.639) for k in range(8)]

    events: list[Event] = [*burst(0.6), *burst(1.4)]
    steps, t = [], 1.0
    for i in range(1, 11):
        seconds = 0.405 if i == 3 else 0.005
        steps.append(step(i, t, seconds))
        t += seconds
    got = advice.steady(run_of([*events, *steps]), 2, 8)
    assert got.capped_from_s == pytest.approx((0.405 + 7 * 0.005) / 8)
    assert got.step_s == got.workers_step_s == pytest.approx(0.08)


def test_workers_that_keep_up_leave_the_steps_mean_as_it_is() -> None:
    """A full queue: each step takes a batch made long before, and the workers make one for each taken, 20 ms
    after it (the batch in the making at the end is not counted): the same pace, nothing capped."""
    steps = [step(i, 1.0 + 0.02 * i, 0.02) for i in range(1, 12)]
    events: list[Event] = [made(0.5 + 0.01 * k) for k in range(8)]
    events += [made(s.host_start + 0.02) for s in steps[:-1]]
    got = advice.steady(run_of([*events, *steps]), 2, 8)
    assert got.capped_from_s is None and got.step_s == pytest.approx(0.02)
    assert got.workers_step_s == pytest.approx(0.02)


def test_a_capped_re_run_says_so_in_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline at 1.0 s; the first candidate's steps read the queue down (0.2 s) while its workers made a
    batch every 1.1 s: it is 1.1 s, and never named."""
    times = [advice.Steady(1.0), advice.Steady(1.1, 1.1, 0.2), advice.Steady(1.02, 1.0), advice.Steady(1.0)]

    def run(self: advice._Runs, setting: dict[str, Any] | None) -> tuple[CommandRun, float | None] | None:
        if not times:
            return None
        self.last = times.pop(0)
        return CommandRun(argv=("python",), ended="stopped"), self.last.step_s

    monkeypatch.setattr(advice._Runs, "run", run)
    out = advice.measure(("python", "t.py"), ".", {"num_workers": 8}, "t.py:9", 2.5, 2.0, False, 300.0, 0.10)
    first, second = out["candidates"][:2]
    assert first["overrides"]["num_workers"] == 2 and first["mean_step_s"] == 1.1
    assert first["workers_step_s"] == 1.1 and first["capped_from_s"] == 0.2
    assert second["workers_step_s"] == 1.0 and "capped_from_s" not in second
    assert out["faster"] is None


def test_a_re_run_leaves_out_a_step_for_each_batch_its_workers_queued_while_the_script_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asked loader has 8 workers (2 batches each queued by default): its re-runs leave out 2 + 16 steps; a
    candidate of 2 workers with prefetch 4, 2 + 8; with no workers, the 2 of start-up."""
    rules: list[tuple[Any, Any]] = []

    def run_command(argv: Any, rule: Any, cwd: Any, env: Any, out: Any, setting: Any) -> CommandRun:
        rules.append((setting, rule))
        return CommandRun(argv=tuple(argv), ended="stopped")

    monkeypatch.setattr(advice, "run_command", run_command)
    runs = advice._Runs(("python", "t.py"), ".", {"num_workers": 8}, 60.0, advice.time.monotonic())
    for setting in (None, {"num_workers": 2, "prefetch_factor": 4}, {"num_workers": 0}):
        runs.run(setting)
    assert [(s, r.warmup, r.steps) for s, r in rules] == [
        (None, 18, advice.RERUN_STEPS),
        ({"num_workers": 2, "prefetch_factor": 4}, 10, advice.RERUN_STEPS),
        ({"num_workers": 0}, 2, advice.RERUN_STEPS),
    ]
