"""``templates/train.py``, the training script the tool ships: it trains, resumes exactly, runs under torchrun,
refuses bad flags in one line, and ``invoke verify`` (no ``--``) judges it as ``verify -- python templates/train.py``
does: the same verdict and the same report shape on the same planted data.

Real CPU training in child processes (a few seconds each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from checks.errors import PreflightError
from checks.verify.user.run import CommandRequest, verify_command
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.fakes.builtin import PLUGINS, REPO, builtin, config
from tests.fakes.verdicts import planted_id

pytestmark = pytest.mark.slow

TRAIN = REPO / "templates" / "train.py"
TORCHRUN_2 = (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2")
SMALL = ("--data", "synthetic-tokens", "--seq-len", "32", "--batch-size", "8", "--size", "small")


def train(
    *args: str, cwd: Path = REPO, launcher: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([*launcher, str(TRAIN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)  # the default load of torch >= 2.6: what a resume will use


def test_a_resumed_run_ends_with_the_weights_of_the_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    """3 steps, a checkpoint, a fresh process resumed to 6, against 6 in one go: the DataLoader's worker, the
    sampler's position mid-epoch, AdamW's moments and every RNG must all come back for the weights to agree."""
    import torch

    whole = train(*SMALL, "--workers", "1", "--steps", "6", "--ckpt-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    half = train(*SMALL, "--workers", "1", "--steps", "3", "--ckpt-dir", str(tmp_path / "half"))
    assert half.returncode == 0, half.stderr
    resumed = train(*SMALL, "--workers", "1", "--steps", "6", "--ckpt-dir", str(tmp_path / "half"),
                    "--resume", str(tmp_path / "half" / "last.pt"))  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 3 (epoch 0, batch 3)" in resumed.stdout
    a, b = weights(tmp_path / "whole" / "last.pt"), weights(tmp_path / "half" / "last.pt")
    assert a["step"] == b["step"] == 6 and a["loss"] == b["loss"]
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert sorted(a) == ["epoch", "loss", "model", "optimizer", "position", "rng", "scaler", "seed", "step"]
    assert [p.name for p in (tmp_path / "half").iterdir()] == ["last.pt"]  # no partial file left beside it


def test_two_ranks_under_torchrun_train_one_model_over_gloo(tmp_path: Path) -> None:
    done = train(*SMALL, "--workers", "0", "--steps", "3", "--log-every", "1", "--ckpt-dir", str(tmp_path),
                 launcher=TORCHRUN_2)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("trained 3 steps") == 1  # rank 0 speaks for the run
    saved = weights(tmp_path / "last.pt")
    assert not any(k.startswith("module.") for k in saved["model"])  # DDP's wrapper is not in the file


def test_staged_images_train_through_the_staged_dataset_template(tmp_path: Path) -> None:
    """A folder as stage-data writes it: images.npy, labels.npy, classes.json, manifest.json."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "images.npy", rng.integers(0, 255, (64, 32, 32, 3), dtype=np.uint8))
    np.save(tmp_path / "labels.npy", rng.integers(0, 3, 64).astype(np.int64))
    (tmp_path / "classes.json").write_text(json.dumps(["a", "b", "c"]))
    (tmp_path / "manifest.json").write_text(json.dumps({"samples": 64}))
    done = train("--data", str(tmp_path), "--batch-size", "16", "--workers", "0", "--epochs", "2", "--log-every", "1")
    assert done.returncode == 0, done.stderr
    assert "step 8/8" in done.stdout  # 64 samples, batches of 16: 4 steps an epoch, two epochs


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--dataset", "no_such_module:make"), "cannot import no_such_module:make"),
        (("--data", "synthetic-images", "--batch-size", "2000000"), "fewer than one batch of 2000000"),
        (("--accum", "0"), "--accum must be at least 1, got 0"),
        (("--device", "cuda"), "--device cuda, but this torch cannot use CUDA here"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    import torch

    if args[:2] == ("--device", "cuda") and torch.cuda.is_available():
        pytest.skip("this box has CUDA: --device cuda is valid here")
    done = train(*args, "--steps", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_verify_without_a_command_judges_the_script_as_verify_with_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same planted pipeline (every sample waits 4 ms, a linear model) through ``invoke verify`` and through
    ``verify -- python templates/train.py``: the same verdict, the same report shape, both valid under the one
    schema. What only the tool's own script adds is its data row and the resume replay in ``checkpoint``."""
    cfg = config()
    plugins = ("--dataset", f"{PLUGINS}:sleepy", "--model", f"{PLUGINS}:tiny_model")
    built, built_rows, m = builtin(tmp_path / "b", monkeypatch, cfg, dataset=f"{PLUGINS}:sleepy",
                                   model=f"{PLUGINS}:tiny_model", workers=0, steps=8)  # fmt: skip
    command = (sys.executable, str(TRAIN), *plugins, "--batch-size", "16", "--workers", "0", "--steps", "1000")
    request = CommandRequest(cfg, command, steps=8, warmup=2, json=str(tmp_path / "c.json"), gate=False, quiet=True,
                             cwd=str(REPO))  # fmt: skip
    judged = verify_command(request, say=lambda line: None)
    c = judged.report.measurements
    assert planted_id(m) == planted_id(c) == "data-bound", (m["diagnosis"], c["diagnosis"])
    assert m["samples_per_step"] == c["samples_per_step"] == 16
    assert m["dataloader"]["num_workers"] == c["dataloader"]["num_workers"] == 0, (m["dataloader"], c["dataloader"])
    docs = [json.loads(json.dumps(j.report.to_json(), default=str)) for j in (built, judged)]
    for doc in docs:
        assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
    (mine, theirs) = (set(d["measurements"]) for d in docs)
    assert mine - theirs <= {"checkpoint"} and theirs - mine == set(), (mine - theirs, theirs - mine)
    ids = [[r["id"] for r in d["results"]] for d in docs]
    assert [i for i in ids[0] if i != "verify-data"] == ids[1], ids
    assert (
        built_rows["verify-checkpoint"].status.value == "ok" and "reproduces" in built_rows["verify-checkpoint"].summary
    )


def test_verify_exits_2_with_the_commands_own_line_when_it_refuses_its_flags(tmp_path: Path) -> None:
    """The script exits 2 before its first step (its argparse refusal): verify says so in one line and exits 2,
    instead of judging a crash with exit 1."""
    cfg = config(command_advice_s=0.0)
    command = (sys.executable, str(TRAIN), "--accum", "0")
    request = CommandRequest(cfg, command, steps=4, warmup=1, json=str(tmp_path / "c.json"), gate=False, quiet=True,
                             cwd=str(tmp_path))  # fmt: skip
    with pytest.raises(PreflightError) as refused:
        verify_command(request, say=lambda line: None)
    assert refused.value.code == 2
    assert "exited 2 before its first step: train.py: error: --accum must be at least 1, got 0" in str(refused.value)
    assert not (tmp_path / "c.json").exists()


def test_a_command_below_the_throughput_floor_fails_as_the_built_in_loop_does(tmp_path: Path) -> None:
    """verify.min_samples_per_s gates a command's samples/s too (a job that must sustain a rate)."""
    cfg = config(command_advice_s=0.0, min_samples_per_s=1e9)
    command = (sys.executable, str(TRAIN), *SMALL, "--workers", "0", "--steps", "1000")
    request = CommandRequest(cfg, command, steps=3, warmup=1, json=str(tmp_path / "c.json"), gate=False, quiet=True,
                             cwd=str(tmp_path))  # fmt: skip
    judged = verify_command(request, say=lambda line: None)
    row = next(r for r in judged.report.results if r.id == "verify-throughput")
    assert row.status.value == "fail" and "(floor: 1e+09)" in row.summary
    assert "over the command's measured steps" in row.summary and judged.report.exit_code() == 1
