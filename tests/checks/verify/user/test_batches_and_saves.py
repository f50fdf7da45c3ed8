"""verify -- COMMAND on real scripts: samples and tokens per step read from the collated batch, and the time and
bytes of every checkpoint writer users have (one save per outermost call, its bytes what landed on disk)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.checks.verify.user.test_command import row, verify

pytestmark = pytest.mark.slow  # every test runs a real command under verify (4-8 s each on the 2-core box)


def on_disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_a_collate_of_per_image_tensors_counts_images_not_channels(tmp_path: Path) -> None:
    judged = verify(tmp_path, sys.executable, "batch_shapes.py", "images", steps=4)
    m = judged.report.measurements
    assert m["samples_per_step"] == 2  # [image, image] of [3, 32, 32]: it read 3, an image's channels
    assert "tokens_per_step" not in m and m["tokens_per_s"] is None


def test_token_id_batches_give_tokens_per_step_and_per_second(tmp_path: Path) -> None:
    judged = verify(tmp_path, sys.executable, "batch_shapes.py", "tokens", steps=4)
    m = judged.report.measurements
    assert m["samples_per_step"] == 4 and m["tokens_per_step"] == 4 * 32
    assert m["tokens_per_s"] == pytest.approx(128 / m["step_time"]["mean_s"], rel=1e-6)
    assert m["tokens_per_s"] == pytest.approx(32 * m["samples_per_s"], rel=1e-6)
    assert f"{m['tokens_per_s']:,.0f} tokens/s (128 tokens per step)" in row(judged, "verify-loop").summary


@pytest.mark.parametrize("writer", ["torch-buffer", "safetensors", "safetensors-model", "dcp", "accelerate"])
def test_each_checkpoint_writer_is_one_save_of_the_bytes_on_disk(tmp_path: Path, writer: str) -> None:
    # The script saves after every optimizer step into one place, overwriting: what is there at the end is one save.
    out = tmp_path / "out"
    out.mkdir()
    judged = verify(tmp_path, sys.executable, "checkpoint_writers.py", writer, str(out), steps=4)
    m = judged.report.measurements
    ckpt = m["checkpoint"]
    # accelerate's save_state writes model.safetensors, optimizer.bin and random_states_0.pkl (two torch.save
    # calls and a save_file inside it): one save, not three, and its bytes are all three files'.
    assert ckpt["saves"] == 4 and ckpt["every_steps"] == 1
    written = (out / "last.ckpt").stat().st_size if writer == "torch-buffer" else on_disk(out)  # not a .tmp
    assert ckpt["bytes"] == pytest.approx(written, rel=0.1)
    assert ckpt["bytes"] > 5e6 and m["step_breakdown"]["checkpoint"] > 0
    if writer == "accelerate":
        assert sorted(p.name for p in (out / "state").iterdir()) == [
            "model.safetensors", "optimizer.bin", "random_states_0.pkl"
        ]  # fmt: skip


def test_lightning_model_checkpoint(tmp_path: Path) -> None:
    # ModelCheckpoint every 2 steps: torch.save into a BytesIO, then an fsspec write of the file, both inside
    # Trainer.save_checkpoint: one save of the file's bytes, its write timed as checkpoint.
    out = tmp_path / "ckpt"
    judged = verify(tmp_path, sys.executable, "lightning_trainer.py", str(out), steps=6)
    m = judged.report.measurements
    ckpt = m["checkpoint"]
    files = sorted(out.glob("*.ckpt"))
    assert ckpt["saves"] == 3 and ckpt["every_steps"] == 2
    assert ckpt["bytes"] == pytest.approx(files[-1].stat().st_size, rel=0.1)
    assert m["step_breakdown"]["checkpoint"] > 0


def test_transformers_trainer_checkpoint(tmp_path: Path) -> None:
    # save_steps=2: a checkpoint-N folder (safetensors weights, optimizer, scheduler, RNG, trainer state) per save.
    out = tmp_path / "out"
    judged = verify(tmp_path, sys.executable, "hf_trainer.py", str(out), "2", steps=4)
    m = judged.report.measurements
    ckpt = m["checkpoint"]
    folders = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert ckpt["saves"] == 2 and ckpt["every_steps"] == 2
    assert ckpt["bytes"] == pytest.approx(on_disk(folders[-1]), rel=0.1)
    assert m["tokens_per_step"] == 2 * 16 * 64  # 2 micro-batches of 16 dict samples of input_ids [16, 64]
