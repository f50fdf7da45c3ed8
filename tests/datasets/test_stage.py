"""Staging end to end in-process, on real photos: outputs, no-op, restage, rejects, resume, formats, space."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from checks.errors import ExitStatus
from datasets.errors import StageFailure, UsageError
from datasets.manifest import Reject
from datasets.request import Request, allowed_rejects
from datasets.stage import stage, verify
from tests.datasets import jobs
from tests.datasets.photos import psnr, reference

SIZE = 48


def request(src: Path, dest: Path, images: dict[str, Any] | None = None, **kw: Any) -> Request:
    """SIZE px, one worker, up to 10 rejects, else the configured defaults."""
    kw = {"max_rejects": "10", "workers": 1, **kw}
    return jobs.request(src, dest, images={"size": SIZE, **(images or {})}, **kw)


def test_stage_writes_arrays_labels_classes_and_manifest(photo_tree: Path, tmp_path: Path) -> None:
    out = stage(request(photo_tree, tmp_path / "ds")).dest
    images = np.load(out / "images.npy", mmap_mode="r")
    labels = np.load(out / "labels.npy")
    doc = json.loads((out / "manifest.json").read_text())
    assert images.shape == (72, SIZE, SIZE, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and labels.tolist() == [0] * 24 + [1] * 24 + [2] * 24
    assert json.loads((out / "classes.json").read_text()) == ["cat", "dog", "fish"]
    assert doc["counts"] == {"inputs": 77, "staged": 72, "rejected": 5, "tokens": 0}
    assert doc["classes"]["per_class"] == {"cat": 24, "dog": 24, "fish": 24}
    assert {r["path"] for r in doc["rejects"]} == {
        "cat/half.png",
        "cat/noise.jpg",
        "cat/text.jpg",
        "cat/truncated.jpg",
        "cat/zero.jpg",
    }
    assert set(doc["outputs"]) == {"images.npy", "labels.npy", "classes.json"}
    assert doc["parameters"]["size"] == SIZE and doc["tool"].startswith("gpu-preflight")
    assert sorted(p.name for p in out.iterdir()) == ["classes.json", "images.npy", "labels.npy", "manifest.json"]
    assert verify(out) == []


def test_staged_rows_match_an_independent_decode(photo_tree: Path, tmp_path: Path) -> None:
    out = stage(request(photo_tree, tmp_path / "ds")).dest
    images = np.load(out / "images.npy", mmap_mode="r")
    good = sorted(p for p in (photo_tree / "dog").iterdir())
    for k in (0, 7, 23):
        want = reference(good[k].read_bytes(), SIZE)
        assert psnr(images[24 + k], want) > 30


@pytest.mark.slow
def test_rerun_is_a_noop_and_output_is_deterministic_across_worker_counts(photo_tree: Path, tmp_path: Path) -> None:
    one = stage(request(photo_tree, tmp_path / "one"))
    again = stage(request(photo_tree, tmp_path / "one"))
    two = stage(request(photo_tree, tmp_path / "two", workers=2))
    assert not one.noop and again.noop
    for name in ("images.npy", "labels.npy", "classes.json"):
        assert (one.dest / name).read_bytes() == (two.dest / name).read_bytes()


@pytest.mark.slow
def test_changed_source_or_parameters_restage(source_copy: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    stage(request(source_copy, dest))
    (source_copy / "fish" / sorted(os.listdir(source_copy / "fish"))[0]).unlink()
    changed = stage(request(source_copy, dest))
    assert "source changed" in " ".join(changed.notes) and changed.manifest.contents.counts.staged == 71
    resized = stage(request(source_copy, dest, images={"size": 32}))
    assert "parameters changed (size)" in " ".join(resized.notes)
    assert np.load(dest / "images.npy", mmap_mode="r").shape == (71, 32, 32, 3)


@pytest.mark.slow
def test_too_many_rejects_fail_then_resume_with_a_higher_limit(photo_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(StageFailure, match="more than --max-rejects allows") as info:
        stage(request(photo_tree, tmp_path / "ds", max_rejects="1"))
    assert info.value.code == ExitStatus.PROBLEMS
    assert not (tmp_path / "ds").exists() and (tmp_path / ".ds.staging" / "journal.jsonl").exists()
    resumed = stage(request(photo_tree, tmp_path / "ds", max_rejects="10%"))
    assert "resuming an unfinished run" in resumed.notes
    straight = stage(request(photo_tree, tmp_path / "straight"))
    assert (resumed.dest / "images.npy").read_bytes() == (straight.dest / "images.npy").read_bytes()


@pytest.mark.slow
def test_pt_shards_hold_the_same_samples_and_load_weights_only(photo_tree: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    npy = stage(request(photo_tree, tmp_path / "npy")).dest
    pt = stage(request(photo_tree, tmp_path / "pt", format="pt", images={"shard_size": 20})).dest
    shards = sorted(pt.glob("shard-*.pt"))
    assert len(shards) == 4  # 72 samples in shards of 20
    loaded = [torch.load(p, weights_only=True) for p in shards]
    images = np.concatenate([d["images"].numpy() for d in loaded])
    labels = np.concatenate([d["labels"].numpy() for d in loaded])
    assert (images == np.load(npy / "images.npy")).all() and (labels == np.load(npy / "labels.npy")).all()
    assert verify(pt) == []


def test_verify_finds_a_changed_byte(photo_tree: Path, tmp_path: Path) -> None:
    out = stage(request(photo_tree, tmp_path / "ds")).dest
    with (out / "images.npy").open("r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x01")
    assert any("sha256 differs" in p for p in verify(out))
    (out / "labels.npy").unlink()
    assert any("labels.npy: missing" in p for p in verify(out))


def test_a_folder_that_is_not_a_staged_dataset_is_never_replaced(photo_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(UsageError, match="not a staged dataset"):
        stage(request(photo_tree, tmp_path / "mine"))
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_list_source_with_a_missing_file(photo_tree: Path, tmp_path: Path) -> None:
    rows = ["path,label", *(f"{p.relative_to(photo_tree.parent)},{p.parent.name}" for p in photo_tree.glob("fish/*"))]
    rows.append("train/fish/does-not-exist.jpg,fish")
    (photo_tree.parent / "list.csv").write_text("\n".join(rows) + "\n")
    try:
        doc = stage(request(photo_tree.parent / "list.csv", tmp_path / "ds")).manifest
    finally:
        (photo_tree.parent / "list.csv").unlink()
    assert doc.contents.counts.staged == 24 and doc.source.layout == "list"
    assert doc.contents.rejects == (
        Reject(path="train/fish/does-not-exist.jpg", reason="unreadable: No such file or directory"),
    )


@pytest.mark.slow
def test_not_enough_space_exits_1_with_numbers_and_writes_nothing(photo_tree: Path, small_fs: Path) -> None:
    with pytest.raises(StageFailure, match=r"not enough free space .* need 243.6 MiB, 24.0 MiB free") as info:
        stage(request(photo_tree, small_fs / "ds", images={"size": 1024}))
    assert "--size 512 needs" in str(info.value)
    assert os.listdir(small_fs) == []  # not even the lock file


@pytest.mark.slow
def test_disk_full_mid_run_keeps_the_staging_folder_and_resumes(
    photo_tree: Path, tmp_path: Path, small_fs: Path
) -> None:
    archive = tmp_path / "photos.tar.gz"  # 15 MiB on disk, 45 MiB unpacked: passes the size floor, then fills up
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(photo_tree, arcname="photos")
        tar.addfile(tarfile.TarInfo("photos/cat/filler.bin"), io.BytesIO())
        big = tarfile.TarInfo("photos/filler/huge.bin")
        big.size = 30 << 20  # more than the 24 MiB filesystem holds
        tar.addfile(big, io.BytesIO(b"\0" * big.size))
    with pytest.raises(StageFailure, match="disk full") as info:
        stage(request(archive, small_fs / "ds"))
    assert info.value.code == ExitStatus.PROBLEMS and (small_fs / ".ds.staging" / "journal.jsonl").exists()
    assert not (small_fs / "ds").exists()
    subprocess.run(["mount", "-o", "remount,size=96m", str(small_fs)], check=True)
    done = stage(request(archive, small_fs / "ds"))
    assert "resuming an unfinished run" in done.notes and done.manifest.contents.counts.staged == 72
    assert not (small_fs / ".ds.staging").exists()


def test_max_rejects_accepts_counts_and_fractions() -> None:
    assert allowed_rejects("25", 1000) == 25
    assert allowed_rejects("0.1%", 5000) == 5
    assert allowed_rejects("0.01", 1000) == 10
    with pytest.raises(UsageError):
        allowed_rejects("lots", 10)


@pytest.mark.slow
def test_a_lost_dataset_in_between_is_restaged(photo_tree: Path, tmp_path: Path) -> None:
    dest = stage(request(photo_tree, tmp_path / "ds")).dest
    (dest / "images.npy").write_bytes(b"")
    again = stage(request(photo_tree, dest))
    assert not again.noop and "incomplete" in " ".join(again.notes)
    shutil.rmtree(dest)
    assert not stage(request(photo_tree, dest)).noop
