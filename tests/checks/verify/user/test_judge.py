"""The parent side of ``verify -- COMMAND`` without a command: step lines in, figures and rows out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from checks.reports.verify import Checkpoint
from checks.verify import events
from checks.verify.events import Event, Hello, StepLine
from checks.verify.user import judge as j
from checks.verify.user.launch import SPLIT_ENV, SPLIT_EVERY, CommandRun, _Tails, environment, step_counts
from tests.checks.verify.recorded import parsed


def step(i: int, pid: int = 10, rank: int | None = None, **over: Any) -> Event:
    base = {"event": "step", "i": i, "pid": pid, "rank": rank, "world_size": 2 if rank is not None else None}
    base |= {"data_wait": 0.06, "h2d": 0.0, "forward": 0.02, "backward": 0.015, "optimizer": 0.005}
    base |= {"checkpoint": 0.0, "saves": 0, "ckpt_bytes": 0, "micro": 2, "samples": 16, "feed": "data:1"}
    base |= {"host_start": float(i), "host_end": i + 0.1, "enqueue_s": 0.04, "fetch": [], "loss": 1.0 / i}
    return parsed(base | over)


def test_ranks_leave_out_the_warm_up_and_stop_at_the_asked_steps() -> None:
    events = [step(i) for i in range(1, 10)]
    (only,) = j.ranks(events, warmup=2, steps=5, seconds=0)
    assert [s.i for s in only.warmup] == [1, 2]
    assert [s.i for s in only.steps] == [3, 4, 5, 6, 7]


def test_shares_add_up_with_checkpoints_amortised_over_the_measured_steps() -> None:
    events = [step(i, checkpoint=0.1 if i % 2 else 0.0, saves=i % 2, ckpt_bytes=(i % 2) * 10**6) for i in range(1, 6)]
    (r,) = j.ranks(events, warmup=1, steps=4, seconds=0)
    figs = j.rank_figures(r)
    assert figs is not None
    assert abs(sum(figs.fig.shares.values()) - 1.0) < 1e-9
    assert figs.checkpoint == Checkpoint(save_s=0.1, bytes=10**6, every_steps=2.0, saves=2)
    assert abs(figs.fig.shares["data_wait"] - 0.06 / 0.15) < 1e-9  # 0.1 step + 0.05 amortised save
    assert figs.micro_batches == 2 and figs.samples_per_step == 16


def test_every_rank_counts_and_the_world_size_comes_from_the_ranks() -> None:
    events = [step(i, pid=p, rank=r) for i in range(1, 4) for p, r in ((11, 0), (12, 1))]
    counts, world = step_counts(events)
    assert counts == {0: 3, 1: 3} and world == 2
    # torchrun across 2 nodes, one rank each: this node's verify sees rank 1 only and must stop on it (it waited
    # for a rank 0 it can never see, and trained on, in the sbatch template's job on a real Slurm cluster).
    node = [step(i, pid=12, rank=1, world_size=2, local_world_size=1) for i in range(1, 4)]
    assert step_counts(node) == ({1: 3}, 1)
    assert [r.key for r in j.ranks(events, 1, 2, 0)] == [0, 1]


def test_a_crash_names_its_exit_status_and_the_end_of_its_traceback() -> None:
    run = CommandRun(argv=("python", "train.py"), returncode=1, ended="crashed")
    run.stderr_tail = ["noise", "Traceback (most recent call last):", '  File "train.py", line 3', "ValueError: bad"]
    result = j.command_result(run, [], warmup=1)
    assert result.status.value == "fail"
    assert "exit status 1" in result.summary and result.summary.endswith("ValueError: bad")
    assert run.traceback()[0].startswith("Traceback")


def test_the_start_up_folder_goes_first_and_the_users_pythonpath_stays(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PYTHONPATH", "/their/path")
    env = environment(tmp_path, {"num_workers": 2})
    assert env["PYTHONPATH"] == f"{tmp_path / 'inject'}{os.pathsep}/their/path"
    assert json.loads(env["GPU_PREFLIGHT_LOADER"]) == {"num_workers": 2}


def test_the_tail_reads_complete_lines_of_every_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each complete line is parsed once into its record; a line of an unknown kind, or a broken one, is kept
    out and counted (it never stops verify; the tests' strict parse, off here, would raise)."""
    monkeypatch.setattr(events, "STRICT", False)
    tails = _Tails(tmp_path)
    hello = '{"event": "hello", "t": 1.5, "pid": %d}'
    line = json.dumps(step(1).to_json())
    (tmp_path / "events-1.jsonl").write_text(hello % 1 + "\n" + line[:30], encoding="utf-8")
    (tmp_path / "events-2.jsonl").write_text(hello % 2 + "\n", encoding="utf-8")
    got = tails.read()
    assert [(type(e), e.pid) for e in got] == [(Hello, 1), (Hello, 2)] and tails.dropped == 0
    with (tmp_path / "events-1.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(
            line[30:] + '\n{"event": "later-kind", "t": 2, "pid": 1}\n{"event": "step", "t": 2, "pid": 1}\nnot json\n'
        )
    (later,) = tails.read()
    assert isinstance(later, StepLine) and later == step(1)
    assert tails.dropped == 3  # an unknown kind, a step without its fields, a line that is not JSON


def _advice(*speedups: float) -> dict[str, Any]:
    rows = [
        {"overrides": {"num_workers": n + 1, "persistent_workers": True}, "speedup": x} for n, x in enumerate(speedups)
    ]
    return {"baseline_mean_step_s": 0.0013, "min_gain": 0.1, "faster": None, "candidates": rows}


def test_settings_measured_slower_are_not_advised_again() -> None:
    rule = "set num_workers > 0 (the main process loads every batch itself)"
    slower = j.measured_fix(_advice(0.31, 0.36), rule)
    assert slower.startswith("keep the DataLoader as it is: every setting tried measured slower")
    assert "num_workers=1, persistent_workers=True: 0.31x" in slower and "1.3 ms a step" in slower
    assert "set num_workers > 0" not in slower
    # One setting about as fast (not the 10% asked): what was measured, then what is left, not the rule's own
    # "more workers" that was just measured no faster.
    mixed = j.measured_fix(_advice(0.31, 1.04), rule)
    assert mixed.startswith("no DataLoader setting measured 10% faster") and "set num_workers > 0" not in mixed
    assert mixed.endswith("the loader's settings are not the limit: make each batch cheaper to produce (decode once "
                          "ahead with invoke stage-data, lighter augmentation), or rent more CPU cores per GPU")  # fmt: skip
    # The unchanged command's re-runs spread wider than any gain: not measurable here, said so, no guess.
    noisy = j.measured_fix(_advice(1.15) | {"not_measurable": "re-runs of the unchanged command differed by 40%"}, rule)
    assert noisy.startswith("no DataLoader change is measurable on this box now: re-runs of the unchanged command")
    assert "num_workers=1, persistent_workers=True: 1.15x" in noisy and "set num_workers" not in noisy
    assert j.measured_fix({"faster": None, "candidates": []}, rule) == rule  # nothing timed: the rule alone


def test_settings_measured_slower_on_saturated_cores_say_the_cores_are_full() -> None:
    """A cpu-starved verdict: more workers measured slower because the cores are already busy, not because the
    hand-off costs more than it saves (the data-bound wording above); the fix names the cores' figures."""
    from checks.verify.diagnosis import Verdict

    rule = "move decoding/augmentation off the CPU or do it once ahead of time (invoke stage-data)"
    ev = {"cpu_during_wait": 0.84, "machine_cpu_during_wait": 0.91, "usable_cores": 2.0}
    starved = Verdict("cpu-starved", "critical", "high", "the loop waits for data 61% of each step", rule, 0.61, ev)
    (top,) = j.apply_advice([starved], _advice(0.62, 0.55))
    assert top.fix.startswith("keep the DataLoader as it is: every setting tried measured slower"), top.fix
    assert "the 2 usable cores are already 91% busy while the loop waits (84% your training processes)" in top.fix
    assert "more workers only split the same CPU" in top.fix and "costs more than it saves" not in top.fix
    assert top.evidence["command_advice"]["candidates"][0]["speedup"] == 0.62
    # The same measurements under a data-bound verdict keep the hand-off's explanation.
    (bound,) = j.apply_advice([Verdict("data-bound", "warn", "medium", "waits", rule, 0.3, ev)], _advice(0.62, 0.55))
    assert "costs more than it saves" in bound.fix and "split the same CPU" not in bound.fix


def test_the_rank_the_others_wait_for_is_the_straggler() -> None:
    from checks.config import make_config
    from checks.verify.distributed import straggler

    # Rank 1 waits 40 ms more for its data each step; rank 0 waits as long inside backward (the all-reduce).
    slow = {"data_wait": 0.046}
    waiting = {"data_wait": 0.006, "backward": 0.055}
    events = [step(i, pid=p, rank=r, **over) for i in range(1, 6) for p, r, over in ((11, 0, waiting), (12, 1, slow))]
    figures = j.rank_rows(j.ranks(events, 1, 4, 0))
    assert [(x.rank, round(x.own_s or 0, 3)) for x in figures.per_rank] == [(0, 0.031), (1, 0.071)]
    found = straggler(figures.per_rank, make_config().verify)
    assert found is not None and found["rank"] == 1 and found["score"] > 1
    lead = j.pace_setter(j.ranks(events, 1, 4, 0), make_config().verify)
    assert lead is not None and lead.key == 1  # its breakdown explains the step, not rank 0's waiting
    even = [step(i, pid=p, rank=r, data_wait=0.006) for i in range(1, 6) for p, r in ((11, 0), (12, 1))]
    assert straggler(j.rank_rows(j.ranks(even, 1, 4, 0)).per_rank, make_config().verify) is None
    lead = j.pace_setter(j.ranks(even, 1, 4, 0), make_config().verify)
    assert lead is not None and lead.key == 0


def test_the_steps_precision_and_the_counted_flops_make_the_mfu_on_a_gpu() -> None:
    """Found on a rented H200: a bf16-autocast script was told "compute-bound in fp32: use bf16 autocast" and its
    MFU read "no None peak". The steps' precision and the agent's FLOP count reach the child result now."""
    from checks.reports.verify import Device
    from checks.verify.report import mfu

    gpu = parsed({"event": "device", "pid": 10, "type": "cuda", "name": "NVIDIA H200", "uuid": None, "index": 0})
    count = parsed({"event": "flops", "pid": 10, "step": 1, "flops": 10**12})
    events = [gpu, count, *(step(i, precision="bf16") for i in range(1, 6))]
    (r,) = j.ranks(events, 1, 4, 0)
    figs = j.rank_figures(r)
    child = j._child_result(r, figs)
    assert child.precision == "bf16" and child.flops_per_step == 10**12
    assert child.device == Device(type="cuda", name="NVIDIA H200", uuid=None)
    got = mfu(child, 0.1)  # 10 TFLOP/s of the H200's 989 dense bf16
    assert got.value is not None and abs(got.value - 10 / 989) < 1e-9, got
    (uncounted,) = j.ranks([gpu, *(step(i) for i in range(1, 6))], 1, 4, 0)
    child = j._child_result(uncounted, j.rank_figures(uncounted))
    assert child.precision is None and child.flops_per_step is None
    assert "--warmup 2 or more" in (child.flops_note or "") and "--warmup 2 or more" in mfu(child, 0.1).note


def test_the_agent_counts_the_last_warm_up_step_of_the_run_only(tmp_path: Path) -> None:
    assert environment(tmp_path, None, 5)["GPU_PREFLIGHT_COUNT_STEP"] == "5"
    assert "GPU_PREFLIGHT_COUNT_STEP" not in environment(tmp_path, {"num_workers": 2}, 0)


def test_the_agent_splits_a_samples_transforms_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPLIT_ENV, "1")  # left in the shell by an earlier run: never passed on unasked
    assert environment(tmp_path, None, split=True)[SPLIT_ENV] == str(SPLIT_EVERY)
    assert SPLIT_ENV not in environment(tmp_path, None)


def test_the_agent_profiles_a_warm_up_step_only_when_asked(tmp_path: Path) -> None:
    assert environment(tmp_path, None, 5, profile_step=4)["GPU_PREFLIGHT_PROFILE_STEP"] == "4"
    assert "GPU_PREFLIGHT_PROFILE_STEP" not in environment(tmp_path, {"num_workers": 2}, 0)


GPU = parsed({"event": "device", "pid": 10, "type": "cuda", "name": "NVIDIA H100 80GB HBM3", "uuid": None, "index": 0})
GIB = 1024**3


def memory(pid: int = 10, **over: Any) -> Event:
    """The agent's memory line: an 80 GiB card, 75 GiB reserved at peak for 60 GiB allocated."""
    line = {"event": "memory", "pid": pid, "total_bytes": 80 * GIB, "free_bytes": 5 * GIB, "allocated_bytes": 60 * GIB,
            "reserved_bytes": 74 * GIB, "peak_allocated_bytes": 70 * GIB, "peak_reserved_bytes": 75 * GIB,
            "inactive_split_bytes": 0, "num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 12, "step": 5,
            "at": "exit", "rank": None}  # fmt: skip
    return parsed(line | over)


def test_the_agents_memory_and_kernels_lines_reach_the_verdicts() -> None:
    """The allocator's figures (the last memory line of the process) and the profiled step's kernels become the
    child result's ``memory`` and ``kernels``: near-oom and launch-bound fire on a command as on the built-in loop."""
    from checks.config import make_config
    from checks.verify.diagnosis import Signals, diagnose

    kernels = parsed({"event": "kernels", "pid": 10, "step": 1, "steps": 1, "kernels_per_step": 1800.0,
                      "median_kernel_us": 3.9, "short_kernel_time_share": 0.8, "busy_fraction": 0.25, "rank": None})  # fmt: skip
    compute: dict[str, Any] = {"data_wait": 0.0, "forward": 0.04, "backward": 0.05, "optimizer": 0.01}
    early = memory(peak_reserved_bytes=10 * GIB, at="step")  # read at step 1, before the peak grew
    events = [GPU, kernels, early, *(step(i, **compute) for i in range(1, 9)), memory()]
    (r,) = j.ranks(events, 2, 6, 0)
    child = j._child_result(r, j.rank_figures(r))
    assert child.memory is not None and child.memory["peak_reserved_bytes"] == 75 * GIB  # the last line
    assert "event" not in child.memory and "at" not in child.memory and "pid" not in child.memory
    assert child.kernels == {"step": 1, "steps": 1, "kernels_per_step": 1800.0, "median_kernel_us": 3.9,
                             "short_kernel_time_share": 0.8, "busy_fraction": 0.25}  # fmt: skip
    shares = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.4, "backward": 0.5, "optimizer": 0.1, "checkpoint": 0.0}
    signals = Signals(30, "cuda", shares, 0.1, memory=child.memory, kernels=child.kernels)
    assert [v.id for v in diagnose(signals, make_config().verify)] == ["launch-bound", "near-oom"]
    (cpu,) = j.ranks([step(i) for i in range(1, 5)], 1, 3, 0)  # a CPU run: no lines, nothing read
    assert j._child_result(cpu, j.rank_figures(cpu)).memory is None and cpu.kernels is None


def test_an_out_of_memory_run_s_memory_is_the_process_that_ran_out() -> None:
    ran_out = memory(pid=11, num_ooms=1, peak_reserved_bytes=79 * GIB, rank=1)
    fine = memory(pid=10, peak_reserved_bytes=int(79.5 * GIB), rank=0)  # fuller, but no out-of-memory error counted
    got = j.oom_memory([fine, memory(pid=11, at="step", rank=1), ran_out])
    assert got is not None and got["num_ooms"] == 1 and got["peak_reserved_bytes"] == 79 * GIB
    assert "event" not in got and "pid" not in got and "rank" not in got
    assert j.oom_memory([fine])["peak_reserved_bytes"] == 79.5 * GIB  # type: ignore[index]
    assert j.oom_memory([step(1)]) is None  # a CPU run: none


def test_one_save_on_rank_0_does_not_make_it_a_straggler() -> None:
    """Rank 0 saves for every rank, once among a few measured steps: the save is the checkpoint share's, not rank
    0's own work (counted in, the 1 s save made rank 0 a straggler of the two gloo ranks replayed)."""
    from checks.config import make_config
    from checks.verify.distributed import straggler

    events = [step(i, pid=p, rank=r) for i in range(1, 6) for p, r in ((11, 0), (12, 1))]
    events += [step(6, pid=11, rank=0, checkpoint=1.0, saves=1, ckpt_bytes=10**8), step(6, pid=12, rank=1)]
    found = j.ranks(events, 4, 2, 0)  # measured: 5 and 6 (rank 0 saves in step 6): the median is their mean
    rows = j.rank_rows(found).per_rank
    assert [x.own_s for x in rows] == [rows[1].own_s, rows[1].own_s]  # the save left out
    assert straggler(rows, make_config().verify) is None
    figs = j.rank_figures(found[0])
    assert figs is not None and figs.checkpoint is not None and figs.checkpoint.save_s == 1.0  # still judged


def test_token_batches_price_a_million_tokens() -> None:
    """The tokens per step over the samples per step are the child's tokens per sample (``cost_block`` prices a
    million tokens with it); batches without token ids have none."""
    from checks.reports.verify import Files
    from checks.verify.report import Setting, cost_block

    events = [step(i, samples=16, tokens=16 * 512) for i in range(1, 6)]
    (r,) = j.ranks(events, 1, 4, 0)
    figs = j.rank_figures(r)
    child = j._child_result(r, figs)
    assert child.tokens_per_sample == 512
    setting = Setting(2.0, Files("r.json", "r.samples.csv", "r.png"), price_per_hour=3.6)
    assert figs is not None
    _, cost = cost_block(setting, child, figs.fig)
    assert cost is not None and cost["per_million_tokens"] == round(cost["per_million_samples"] / 512, 6)
    (plain,) = j.ranks([step(i) for i in range(1, 5)], 1, 3, 0)
    assert j._child_result(plain, j.rank_figures(plain)).tokens_per_sample == 0
