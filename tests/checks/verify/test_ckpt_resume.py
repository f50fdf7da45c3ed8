"""The checkpoint round trip on real pipelines: an ImageFolder of real photos decoded in DataLoader workers.

The checkpoint check replays the batches of the first leg after the reload, so it proves model, optimizer, scaler,
RNG and step state whatever the pipeline draws; whether the data itself resumes exactly is its own result,
``verify-data-resume``. Random augmentation in workers cannot resume exactly (workers reseed from the loader's base
seed when the iterator is re-created): that warns, and the checkpoint still passes. Fixed transforms resume exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.verify.smoke_plugins import PHOTO_ROOT_ENV
from tests.datasets.photos import image_tree, photo_bytes
from tests.fakes.smoke import PLUGINS, checkpoint, config, smoke

pytestmark = pytest.mark.slow
# What the assertions read is the checkpoint round trip after the loop: a short loop, and no DataLoader timing
# afterwards (the loader probe runs when a loop waits for data, as photo decoding does).
ROUND_TRIP = {"steps": 2, "warmup": 1, "loader_probe_s": 0}


@pytest.fixture
def photo_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """48 re-encoded real photos (scikit-image's), 4 classes; the child finds them through the environment."""
    photo_bytes("rocket.jpg")  # skips here, not in the child, without scikit-image
    root = image_tree(tmp_path / "photos", 12, ("a", "b", "c", "d"))
    monkeypatch.setenv(PHOTO_ROOT_ENV, str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return root


def test_random_augmentation_in_workers_passes_the_checkpoint_and_warns_on_data_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_tree: Path
) -> None:
    outcome, results, m = smoke(
        tmp_path,
        monkeypatch,
        config(**ROUND_TRIP),
        dataset=f"{PLUGINS}:photos_augmented",
        model=f"{PLUGINS}:tiny_model",
        workers=2,
    )
    ckpt = checkpoint(outcome)
    assert results["verify-checkpoint"].status.value == "ok", results["verify-checkpoint"].summary
    assert ckpt.reproduced is True and ckpt.uninterrupted == ckpt.resumed
    resume = results["verify-data-resume"]
    assert resume.status.value == "warn", resume.summary
    assert ckpt.data is not None and ckpt.data.order_same is True and ckpt.data.exact is False
    assert "worker" in resume.summary and "(epoch, index)" in (resume.hint or "")
    assert m["checkpoint"]["data"]["batches"] == 2


def test_fixed_transforms_resume_the_data_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photo_tree: Path
) -> None:
    outcome, results, _ = smoke(
        tmp_path,
        monkeypatch,
        config(**ROUND_TRIP),
        dataset=f"{PLUGINS}:photos_fixed",
        model=f"{PLUGINS}:tiny_model",
        workers=2,
    )
    assert results["verify-checkpoint"].status.value == "ok", results["verify-checkpoint"].summary
    assert results["verify-data-resume"].status.value == "ok", results["verify-data-resume"].summary
    data = checkpoint(outcome).data
    assert data is not None and data.exact is True


def test_entropy_in_the_dataset_warns_on_data_resume_not_on_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process reads (no workers) drawing from the OS entropy pool: no saved RNG state can reproduce them.
    outcome, results, _ = smoke(
        tmp_path,
        monkeypatch,
        config(**ROUND_TRIP),
        dataset=f"{PLUGINS}:entropy",
        model=f"{PLUGINS}:tiny_model",
        workers=0,
    )
    ckpt = checkpoint(outcome)
    assert ckpt.reproduced is True and results["verify-checkpoint"].status.value == "ok"
    resume = results["verify-data-resume"]
    assert resume.status.value == "warn" and "OS entropy" in resume.summary, resume.summary


def test_state_outside_the_checkpoint_fails_the_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, results, _ = smoke(
        tmp_path, monkeypatch, config(**ROUND_TRIP), dataset=f"{PLUGINS}:patterned", model=f"{PLUGINS}:forgetful_model"
    )
    ckpt = checkpoint(outcome)
    assert ckpt.reproduced is False and ckpt.uninterrupted != ckpt.resumed
    assert results["verify-checkpoint"].status.value == "fail"
    assert "persistent=False" in (results["verify-checkpoint"].hint or "")
    assert results["verify-data-resume"].status.value == "ok"  # the data did resume: the fault is the model's
