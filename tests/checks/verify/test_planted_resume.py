"""The checkpoint round trip of the tool's own script on real pipelines: an ImageFolder of real photos decoded in
DataLoader workers (a fixed crop, or random augmentation), a model with state outside its ``state_dict``.

verify keeps the script's first checkpoint aside, starts the script again with ``--resume`` from it and compares
the losses of the steps after the save (``checks/verify/builtin.py``'s replay): the resumed script draws its
batches from the position the file holds, so equal losses prove model, optimizer, RNG states and the data
position together.
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
    assert row.status.value == "ok", row.summary
    assert ckpt["reproduced"] is True and ckpt["uninterrupted"] == ckpt["resumed"]


def test_random_augmentation_in_workers_fails_the_round_trip_naming_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_tree: Path
) -> None:
    """Each worker's RNG is seeded when the loader starts: the resumed script draws other crops and flips for the
    same samples, and no checkpoint can hold them. The fix names the data beside the model (the same code path as
    a dataset drawing from the OS entropy pool, which the built-in loop's test planted in the training process)."""
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:photos_augmented",
        model=f"{PLUGINS}:tiny_model", workers=2,
    )  # fmt: skip
    ckpt = round_trip(run)
    row = run.rows["verify-checkpoint"]
    assert ckpt["reproduced"] is False and row.status.value == "fail", row.summary
    assert "on the same samples" in row.summary, row.summary
    hint = row.hint or ""
    assert "random augmentation in DataLoader workers" in hint and "OS entropy pool" in hint, hint
    assert "persistent=False" in hint  # the model's causes are still named: the replay cannot tell them apart


@pytest.mark.skip(
    reason="not on the command path: it has no verify-data-resume row. The built-in loop fed the first leg's "
    "batches to the reloaded model (proving the checkpoint whatever the pipeline draws) and compared the rebuilt "
    "loader's batches apart, so data that cannot resume exactly (random augmentation in workers, OS entropy) "
    "warned there while the checkpoint passed; the script's replay draws its own batches, so the same data fails "
    "verify-checkpoint (test above), its fix naming data and model causes together"
)
def test_data_that_cannot_resume_warns_on_data_resume_and_passes_the_checkpoint() -> None:
    """Was test_ckpt_resume.py's random-augmentation-in-workers and entropy tests: ``verify-checkpoint`` ok
    (uninterrupted == resumed on the same batches), ``verify-data-resume`` warn naming the workers' reseeding
    ('(epoch, index)' in its fix) or the OS entropy pool."""


def test_state_outside_the_checkpoint_fails_the_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = builtin(
        tmp_path, monkeypatch, config(), **ROUND_TRIP, dataset=f"{PLUGINS}:patterned",
        model=f"{PLUGINS}:forgetful_model", workers=0,
    )  # fmt: skip
    ckpt = round_trip(run)
    assert ckpt["reproduced"] is False and ckpt["uninterrupted"] != ckpt["resumed"]
    row = run.rows["verify-checkpoint"]
    assert row.status.value == "fail" and "does not reproduce the next 2 steps' loss" in row.summary, row.summary
    assert "persistent=False" in (row.hint or "")
