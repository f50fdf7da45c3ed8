"""Planted bottlenecks, trained for real on the CPU: each must come out as its verdict.

Every test runs verify's real pipeline below the CLI (plan -> child process under the sampler -> judge), with a
dataset or model from ``smoke_plugins`` planted through --dataset/--model. Step counts are small (12 measured),
so verdicts are capped at "warn" by design (critical needs 20 steps); the verdict id is what is asserted.

Each run gets only the phases its assertions read: ``loader_probe_s=0`` where the loader's advice is not asserted
(the verdict is the rule's then; the probe would add seconds of DataLoader timing after the loop), and the tests
that assert on the same run (the heavy model: its verdict, that the loader was not timed, the resume) share it.
The memory-mapped hand-off is asserted in test_advice.py, on the run that also asserts its measured advice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checks.result import Result
from checks.verify.plan import Outcome
from tests.fakes.smoke import PLUGINS, checkpoint, config, smoke
from tests.fakes.verdicts import planted_row

pytestmark = pytest.mark.slow
Smoked = tuple[Outcome, dict[str, Result], dict[str, Any]]


@pytest.mark.measures
def test_sleeping_getitem_is_data_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-item batch sleeps 64 ms in its one worker: 8 measured steps (the fewest a budget leaves) show it."""
    _, results, m = smoke(
        tmp_path,
        monkeypatch,
        config(loader_probe_s=0, steps=8),
        dataset=f"{PLUGINS}:sleepy",
        model=f"{PLUGINS}:tiny_model",
        workers=1,
    )
    assert planted_row(m)["id"] == "data-bound", results["diagnosis"].summary
    assert m["step_breakdown"]["data_wait"] > 0.3
    assert abs(sum(m["step_breakdown"].values()) - 1) < 1e-9
    assert results["verify-loop"].status.value == "ok"
    assert m["step_time"]["steps"] == 8


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Smoked:
    """The built-in model on 32 px synthetic images, one worker: compute-bound. A loader probe is configured
    (5 s) to show it is not run when the loop does not wait for data."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return smoke(
            tmp_path_factory.mktemp("heavy"), monkeypatch, config(image_size=32, loader_probe_s=5.0), workers=1
        )


@pytest.mark.measures
def test_heavy_model_with_free_data_is_compute_bound(
    heavy: Smoked,
) -> None:
    _, results, m = heavy
    assert planted_row(m)["id"] == "compute-bound", results["diagnosis"].summary
    compute = sum(m["step_breakdown"][k] for k in ("forward", "backward", "optimizer"))
    assert compute >= 0.9
    assert results["upgrade-estimate"].value >= 0.9  # only now does faster compute pay off


@pytest.mark.measures
def test_slow_checkpoint_directory_is_checkpoint_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, results, m = smoke(
        tmp_path,
        monkeypatch,
        config(loader_probe_s=0),
        dataset=f"{PLUGINS}:patterned",
        model=f"{PLUGINS}:slow_fsync_model",
        ckpt_dir=str(tmp_path / "ckpt"),
        ckpt_every=5,
        workers=1,
    )
    assert planted_row(m)["id"] == "checkpoint-bound", results["diagnosis"].summary
    assert m["checkpoint"]["save_s"] >= 0.5  # two fsyncs (file, directory) at 250 ms each
    assert m["step_breakdown"]["checkpoint"] > 0.5
    assert results["verify-checkpoint"].status.value == "ok"  # slow, but it still round-trips
    assert not (tmp_path / "ckpt").exists()  # the test checkpoint, and the folder verify made for it, are gone


@pytest.mark.measures
def test_workers_far_above_the_cores_are_cpu_starved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One intra-op thread in the training child: with two, a stalled OpenMP region on the oversubscribed cores can
    # stretch the tiny model's steps past the data wait when other jobs share the box (then: compute-bound).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _, _results, m = smoke(
        tmp_path,
        monkeypatch,
        config(steps=40, loader_probe_s=0),
        dataset=f"{PLUGINS}:busy",
        model=f"{PLUGINS}:tiny_model",
        workers=8,
    )  # 40 steps: 8 workers x prefetch 2 buffer 16 batches while the child sets up; the rest must be produced
    verdict = planted_row(m)
    assert planted_row(m)["id"] == "cpu-starved", verdict
    ev = verdict["evidence"]
    # Our 8 workers saturate the 2 cores; when other jobs share this box, the machine figure shows it instead.
    assert max(ev["cpu_during_wait"], ev["machine_cpu_during_wait"]) >= 0.9
    assert ev["workers"] == 8 and ev["data_wait_share"] >= 0.1


@pytest.mark.measures
def test_a_loop_that_does_not_wait_for_data_does_not_time_the_loader(
    heavy: Smoked,
) -> None:
    outcome, _results, m = heavy
    assert planted_row(m)["id"] == "compute-bound"
    assert outcome.child.result is not None
    assert "loader_alone" not in m and "loader_alone" not in outcome.child.result.timeline


@pytest.mark.measures  # the run it reads is timed (built by whichever of the three tests comes first)
def test_resume_reproduces_the_uninterrupted_loss_bit_for_bit(
    heavy: Smoked,
) -> None:
    outcome, results, _ = heavy
    ckpt = checkpoint(outcome)
    assert ckpt.reproduced is True
    assert ckpt.uninterrupted == ckpt.resumed and ckpt.resumed is not None and len(ckpt.resumed) == 2
    assert results["verify-checkpoint"].status.value == "ok"


def test_oom_at_the_requested_batch_reports_the_largest_batch_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not `measures`: the model raises out-of-memory above a planted batch size, whatever the machine's speed.
    _, results, m = smoke(
        tmp_path,
        monkeypatch,
        config(batch_size_cpu=32),
        dataset=f"{PLUGINS}:patterned",
        model=f"{PLUGINS}:oom_model",
        workers=0,
    )
    assert m["oom"]["batch"] == 32 and m["oom"]["largest_fit"] == 8
    assert results["verify-loop"].status.value == "fail"
    assert "--batch-size 8" in (results["verify-loop"].hint or "")
    assert planted_row(m)["id"] == "near-oom"
