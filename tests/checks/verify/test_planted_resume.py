"""The checkpoint round trip of the tool's own script on real pipelines: an ImageFolder of real photos decoded in
DataLoader workers (a fixed crop, or random augmentation), a model with state outside its ``state_dict``.

verify keeps the script's first checkpoint aside, and the script the batches of the steps after it; verify starts
the script again with ``--resume`` from that file on those batches and compares the losses of the steps after the
save (``checks/verify/resume.py``'s replay): equal losses prove model, optimizer and RNG states whatever the
loader draws (``verify-checkpoint``), and the resumed script's own loader is compared with the kept batches apart
(``verify-data-resume``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.checks.verify.planted_plugins import PHOTO_ROOT_ENV
from tests.datasets.photos import image_tree, photo_bytes
from tests.fakes.planted import PLUGINS, Planted, builtin, config

pytestmark = pytest.mark.slow
# What the assertions read is the round trip after the loop: the save after the one warm-up step, then two steps to
# compare (verify.resume_steps), the third of them in the next epoch of the 48 photos.
ROUND_TRIP: dict[str, Any] = {"steps": 3, "warmup": 1}


@pytest.fixture
def photo_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """48 re-encoded real photos (scikit-image's), 4 classes; the script finds them through the environment."""
    photo_bytes("rocket.jpg")  # skips here, not in the script, without scikit-image
    root = image_tree(tmp_path / "photos", 12, ("a", "b", "c", "d"))
    monkeypatch.setenv(PHOTO_ROOT_ENV, str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return root


def round_trip(run: Planted) -> dict[str, Any]:
    """``measurements.checkpoint`` with the replay's losses (the test fails when there was no replay)."""
    ckpt = run.m.get("checkpoint") or {}
    assert ckpt.get("resumed") is not None, (run.rows["verify-checkpoint"].summary, run.said)
    assert len(ckpt["uninterrupted"]) == 2, ckpt
    return ckpt


def test_fixed_transforms_in_workers_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_tree: Path
) -> None:
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:photos_fixed",
        model=f"{PLUGINS}:tiny_model", workers=2,
    )  # fmt: skip
    ckpt = round_trip(run)
    row = run.rows["verify-checkpoint"]
    assert row.status.value == "ok" and "(same batches replayed)" in row.summary, row.summary
    assert ckpt["reproduced"] is True and ckpt["uninterrupted"] == ckpt["resumed"]
    data = run.rows["verify-data-resume"]
    assert data.status.value == "ok" and "yields the next 2 batches bit for bit" in data.summary, data.summary
    assert ckpt["data"] == {"batches": 2, "exact": True, "order_same": True, "first_difference": None, "workers": 2}


def test_data_that_cannot_resume_warns_on_data_resume_and_passes_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_tree: Path
) -> None:
    """Each worker's RNG is seeded when the loader starts: the resumed script's loader draws other crops and flips
    for the same samples, and no checkpoint can hold them. The replay trains on the first run's batches, so the
    checkpoint passes, and the data warns apart naming the workers' reseeding."""
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:photos_augmented",
        model=f"{PLUGINS}:tiny_model", workers=2,
    )  # fmt: skip
    ckpt = round_trip(run)
    row = run.rows["verify-checkpoint"]
    assert row.status.value == "ok" and ckpt["reproduced"] is True, row.summary
    assert ckpt["uninterrupted"] == ckpt["resumed"]
    data = run.rows["verify-data-resume"]
    assert data.status.value == "warn", data.summary
    assert "the same samples in the same order" in data.summary and "2 DataLoader worker(s)" in data.summary
    assert "index and epoch" in (data.hint or ""), data.hint
    assert ckpt["data"]["exact"] is False and ckpt["data"]["order_same"] is True
    assert "inputs" in ckpt["data"]["differs"], ckpt["data"]


def test_a_dataset_drawing_os_entropy_warns_in_the_training_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No workers: the noise comes from the OS entropy pool in the training process itself, which no saved RNG
    state reproduces; the checkpoint passes on the kept batches all the same."""
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:entropy", model=f"{PLUGINS}:tiny_model",
        workers=0,
    )  # fmt: skip
    ckpt = round_trip(run)
    row = run.rows["verify-checkpoint"]
    assert row.status.value == "ok" and ckpt["uninterrupted"] == ckpt["resumed"], (row.summary, ckpt)
    data = run.rows["verify-data-resume"]
    assert data.status.value == "warn" and "its own generator or OS entropy" in data.summary, data.summary


def test_state_outside_the_checkpoint_fails_the_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:patterned",
        model=f"{PLUGINS}:forgetful_model", workers=0,
    )  # fmt: skip
    ckpt = round_trip(run)
    assert ckpt["reproduced"] is False and ckpt["uninterrupted"] != ckpt["resumed"]
    row = run.rows["verify-checkpoint"]
    assert row.status.value == "fail" and "does not reproduce the next 2 steps' loss" in row.summary, row.summary
    hint = row.hint or ""
    assert "persistent=False" in hint and "augmentation" not in hint, hint  # the same batches: not the data
    assert run.rows["verify-data-resume"].status.value == "ok"  # the rebuilt loader drew the kept batches
