"""DDP's scaling efficiency on the command path (``checks/verify/user/solo.py``): the torchrun command as one
process, and the figures made of it. The real run is test_planted_ddp.py's."""

from __future__ import annotations

from checks.reports.verify import DdpFigures, RankRow
from checks.result import Status
from checks.verify.distributed import ddp_result
from checks.verify.user import solo

TWO = DdpFigures(world_size=2, backend="gloo", per_rank=(RankRow(0, own_s=0.01), RankRow(1, own_s=0.012)))


def test_a_torchrun_command_runs_as_one_process_with_its_own_flags_and_program() -> None:
    argv = ["torchrun", "--nproc_per_node=4", "--rdzv-backend", "c10d", "--max-restarts", "0", "train.py", "--bs", "8"]
    assert solo.solo_argv(argv) == [
        "torchrun", "--standalone", "--nproc-per-node=1", "--max-restarts", "0", "train.py", "--bs", "8",
    ]  # fmt: skip
    module = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pkg"]
    assert solo.solo_argv(module) == [
        "/usr/bin/python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "pkg",
    ]  # fmt: skip
    tool = ["env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "/venv/bin/torchrun", "--nproc-per-node=2", "x"]
    assert solo.solo_argv(tool) == [*tool[:3], "--standalone", "--nproc-per-node=1", "x"]  # the tool's script


def test_where_the_one_process_run_cannot_apply_it_says_so_in_one_line() -> None:
    why = solo.solo_argv(["accelerate", "launch", "train.py"])
    assert why == "the command is not torchrun or python -m torch.distributed.run: verify cannot run it as one process"
    d = solo.scaled(TWO, 200.0, solo.measure(["accelerate", "launch", "train.py"], ".", 30.0))
    assert d.scaling_efficiency is None and d.samples_per_s_one is None and d.scaling_note == why
    assert d.to_json()["scaling_note"] == why
    assert ddp_result(d).summary.endswith(f"no scaling efficiency: {why}; own step ms: rank 0 10.0, rank 1 12.0")


def test_the_scaling_efficiency_is_the_ranks_samples_per_s_over_n_times_one_process() -> None:
    d = solo.scaled(TWO, 150.0, solo.Solo(100.0))
    assert (d.samples_per_s, d.samples_per_s_one, d.scaling_efficiency) == (150.0, 100.0, 0.75)
    assert "scaling_note" not in d.to_json()
    r = ddp_result(d)
    assert r.status is Status.OK and r.value == 0.75
    assert "scaling efficiency 75% (150.0 samples/s against 2 x 100.0 of one process alone)" in r.summary
    assert "the exchange not timed" in r.summary  # no comm hook figure in these figures
