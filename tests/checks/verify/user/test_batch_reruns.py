"""The batch size of the user's own command, set by re-running it (``checks/verify/user/sweep.py``): ``--sweep`` to
the throughput knee, and the largest batch that fits when the asked one runs out of memory.

The real runs train ``scripts/conv_net.py`` (a small conv net on 64 px images, written as users write it) on the
CPU; the out-of-memory run is held to a real address-space limit (``ulimit -v``), so the host allocator fails as
it does on a box that is out of memory.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from checks.config import make_config
from checks.probe.sample import process_tree
from checks.verify.events import LoaderLine, StepLine
from checks.verify.run import Judged
from checks.verify.user import sweep as sweeper
from checks.verify.user.judge import Rank
from checks.verify.user.launch import CommandRun
from checks.verify.user.run import CommandRequest, verify_command
from tests.checks.verify.recorded import parsed
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.checks.verify.user.test_judge import step

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _verify(tmp_path: Path, *command: str, **verify_cfg: Any) -> tuple[Judged, list[str]]:
    cfg = make_config({"verify": {"command_advice_s": 0.0, **verify_cfg}})
    request = CommandRequest(
        cfg, tuple(command), json=str(tmp_path / "r.json"), gate=False, quiet=True, cwd=str(SCRIPTS), sweep=True
    )
    said: list[str] = []
    before = process_tree(os.getpid())
    judged = verify_command(request, say=said.append)
    assert process_tree(os.getpid()) - before == set()  # no re-run leaves anything behind
    doc = json.loads(json.dumps(judged.report.to_json(), default=str))
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
    return judged, said


def _row(judged: Judged, rid: str) -> Any:
    return next(r for r in judged.report.results if r.id == rid)


@pytest.mark.slow
def test_sweep_grows_the_batch_of_the_users_loader_to_the_knee(tmp_path: Path) -> None:
    judged, said = _verify(tmp_path, "python", "conv_net.py", sweep_max_batch=16)
    sweep = judged.report.measurements["sweep"]
    batches = [r["batch"] for r in sweep["rows"]]
    assert batches == [4, 8, 16][: len(batches)] and len(batches) >= 2, sweep  # doubled from the script's 4
    assert sweep["site"].endswith("conv_net.py:18") and sweep["re_runs"] == len(batches) - 1
    measured = [r for r in sweep["rows"] if "samples_per_s" in r]
    assert measured == sweep["rows"] and all(r["samples_per_s"] > 0 for r in measured)
    assert sweep["knee_batch"] in batches
    # Where it stopped: the cap, a doubling that gained too little, or the budget (then said, with the fix).
    last, before = sweep["rows"][-1], sweep["rows"][-2]
    stopped = last["batch"] == 16 or last["samples_per_s"] < before["samples_per_s"] / 0.95 or "cut_at" in sweep
    assert stopped, sweep
    assert (
        _row(judged, "verify-sweep").status.value == "ok"
        and f"knee at batch {sweep['knee_batch']}" in _row(judged, "verify-sweep").summary
    )
    assert any("--sweep: re-running the command from batch 4" in line for line in said)
    assert judged.report.measurements["step_time"]["steps"] >= 1  # the measured run's own figures stand


@pytest.mark.slow
def test_out_of_memory_at_the_asked_batch_gets_the_largest_batch_that_fits(tmp_path: Path) -> None:
    # The address space an imported torch takes (0.64 GB for the CPU build here, 3.2 GB for a CUDA build, which
    # maps its libraries even without a GPU) plus 0.86 GB: batch 256 fits (0.7 GB at peak), batch 640 does not.
    limited = f"ulimit -v {torch_address_space_kb() + 858_000}; exec python conv_net.py --batch-size 640"
    judged, said = _verify(tmp_path, "bash", "-c", limited)
    m = judged.report.measurements
    assert m["command"]["ended"] == "crashed" and _row(judged, "verify-command").status.value == "fail"
    oom = m["oom"]
    assert oom["batch"] == 640 and "allocate" in oom["message"]
    assert 0 < oom["largest_fit"] < 640, oom
    (top,) = m["diagnosis"]["verdicts"][:1]
    assert top["id"] == "near-oom" and f"the largest batch that fits is {oom['largest_fit']}" in top["summary"]
    assert top["fix"].startswith(f"batch_size={oom['largest_fit']} where the DataLoader is built (")
    assert "conv_net.py:18" in top["fix"]
    assert any("ran out of memory: re-running it at smaller batch sizes" in line for line in said)


def torch_address_space_kb() -> int:
    """VmSize of the ``python`` the command runs (the first on PATH) once it has imported torch, in kB."""
    probe = "import torch; print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize')))"
    out = subprocess.run(["bash", "-c", f'exec python -c "{probe}"'], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _rank(loader: dict[str, Any] | None, steps: int = 4) -> Rank:
    """A process with ``steps`` steps (one warm-up) and the loader line of ``loader``'s fields."""
    events = [s for i in range(1, steps + 1) if isinstance(s := step(i, micro=1, samples=8), StepLine)]
    line = parsed({"event": "loader", "pid": 10, "feed": "data:1", "settings": {}} | loader) if loader else None
    assert line is None or isinstance(line, LoaderLine)
    return Rank(0, 10, events[:1], events[1:], line, None)


def test_a_sweep_starts_from_the_loaders_batch_and_names_where_it_is_built() -> None:
    loader = {"batch_size": 8, "asked": {"batch_size": 8, "num_workers": 0}, "site": "train.py:12"}
    first = sweeper.start(_rank(loader))
    assert isinstance(first, sweeper.Start) and (first.batch, first.site) == (8, "train.py:12")
    assert first.samples_per_s == pytest.approx(8 / 0.1)  # 8 samples a 0.1 s step


def test_a_sweep_that_cannot_set_the_batch_size_says_why_in_one_line() -> None:
    assert "without torch.utils.data.DataLoader" in str(sweeper.start(_rank(None)))
    sampler = {"batch_size": None, "asked": {"batch_size": 1}, "site": "train.py:3"}  # a batch_sampler
    assert str(sweeper.start(_rank(sampler))).startswith("the DataLoader at train.py:3 batches with a batch_sampler")
    assert (
        sweeper.start(_rank({"batch_size": 8, "asked": {"batch_size": 8}}, steps=1)) == "no measured step to start from"
    )


def test_a_rerun_that_failed_to_allocate_is_an_oom_row_and_another_crash_is_an_error() -> None:
    run = CommandRun(argv=("python", "t.py"), returncode=1, ended="crashed")
    run.stderr_tail = ["Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory."]
    assert sweeper.oom(run) and sweeper.row_of(run, 64, 2, 8) == {"batch": 64, "oom": True}
    run.stderr_tail = ["Traceback (most recent call last):", "ValueError: bad shape"]
    assert not sweeper.oom(run)
    assert sweeper.row_of(run, 64, 2, 8) == {
        "batch": 64,
        "error": "crashed after 0 measured step(s): ValueError: bad shape",
    }


def _staged(folder: Path, samples: int = 512) -> Path:
    """A folder in stage-data's layout (images.npy, labels.npy, classes.json) of 32 px images."""
    import numpy as np

    folder.mkdir()
    rng = np.random.default_rng(0)
    np.save(folder / "images.npy", rng.integers(0, 256, (samples, 32, 32, 3), dtype=np.uint8))
    np.save(folder / "labels.npy", rng.integers(0, 10, samples).astype(np.int64))
    (folder / "classes.json").write_text(json.dumps([str(i) for i in range(10)]))
    return folder


@pytest.mark.slow
def test_a_loop_over_staged_loader_has_its_data_wait_batch_size_and_marked_h2d(tmp_path: Path) -> None:
    """The tool's own staged_loader hands its batches to the agent's data() mark, and the script marks its copy:
    a loop without torch's DataLoader gets a data wait, samples/s and an h2d share (it read compute-bound, with no
    batch size, before)."""
    root = _staged(tmp_path / "staged")
    cfg = make_config({"verify": {"command_advice_s": 0.0}})
    request = CommandRequest(cfg, ("python", "staged_steps.py", str(root)), steps=8, warmup=2, gate=False, quiet=True,
                             json=str(tmp_path / "r.json"), cwd=str(SCRIPTS))  # fmt: skip
    judged = verify_command(request, say=lambda line: None)
    m = judged.report.measurements
    assert m["samples_per_step"] == 16 and m["samples_per_s"] > 0
    assert m["step_breakdown"]["data_wait"] > 0 and m["step_breakdown"]["h2d"] > 0
    assert m["dataloader"] == {}  # no torch DataLoader: nothing to report, nothing a re-run could set
    doc = json.loads(json.dumps(judged.report.to_json(), default=str))
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
