"""The row file is hashed while it is decoded; the manifest's sha256 values stay those of the files' bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from pathlib import Path

import numpy as np
import pytest

from datasets import finalize, manifest, npyfile
from datasets.finalize import RowHasher
from datasets.stage import stage, verify
from tests.datasets import jobs
from tests.datasets.jobs import crash_on
from tests.datasets.photos import image_tree

ROW = (8, 8, 3)
ROW_BYTES = int(np.prod(ROW))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def row_file(path: Path, rows: int) -> Path:
    """A real row file as the decode leaves it: header, then ``rows`` rows written in place."""
    npyfile.create(path, np.dtype(np.uint8), (rows, *ROW))
    data = np.random.default_rng(7).integers(0, 256, size=(rows, *ROW), dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY)
    try:
        npyfile.write_rows(fd, 0, data)
    finally:
        os.close(fd)
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_digest_is_the_files_sha256_whatever_order_the_ranges_land_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(finalize, "HASH_BLOCK", 100)  # many blocks, none aligned with a row
    path = row_file(tmp_path / "slots.npy", 50)
    cuts = sorted(random.Random(seed).sample(range(1, 50), 9))
    ranges = list(zip([0, *cuts], [*cuts, 50], strict=True))
    random.Random(seed).shuffle(ranges)
    with RowHasher(path, 50, ROW_BYTES) as hasher:
        for start, stop in ranges:
            hasher.add(start, stop)
        assert hasher.digest() == sha256(path)


def test_no_digest_when_a_range_is_missing_it_was_stopped_or_the_file_is_not_the_array(tmp_path: Path) -> None:
    path = row_file(tmp_path / "slots.npy", 20)
    with RowHasher(path, 20, ROW_BYTES) as gap:
        gap.add(0, 5)
        gap.add(6, 20)
        assert gap.digest() is None
    with RowHasher(path, 20, ROW_BYTES) as stopped:
        stopped.add(0, 20)
        stopped.stop()
        assert stopped.digest() is None
    with RowHasher(path, 20, ROW_BYTES) as longer:
        longer.add(0, 20)
        with path.open("ab") as fh:
            fh.write(b"\0")
        assert longer.digest() is None
    with RowHasher(tmp_path / "gone.npy", 20, ROW_BYTES) as missing:
        missing.add(0, 20)
        assert missing.digest() is None


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Re-encoded photos and nothing broken: the row file is published as images.npy unchanged."""
    return image_tree(tmp_path_factory.mktemp("clean") / "train", per_class=12)


def hashed_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the names of the files the finishing step reads back to hash."""
    names: list[str] = []
    real_file = manifest.file_sha256

    def one(path: Path) -> str:
        names.append(path.name)
        return real_file(path)

    monkeypatch.setattr(manifest, "file_sha256", one)
    return names


def assert_manifest_holds_the_files_hashes(dest: Path) -> None:
    """The manifest's outputs are what describing the finished folder from scratch gives, byte for byte."""
    recorded = manifest.read(dest)
    assert recorded is not None
    assert recorded.contents.outputs == manifest.describe_outputs(dest, lambda n: None)
    for name, entry in recorded.contents.outputs.items():
        assert entry.sha256 == sha256(dest / name), name
    assert verify(dest) == []


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_without_rejects_images_npy_is_not_read_again_and_its_hash_is_unchanged(
    clean_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    names = hashed_files(monkeypatch)
    req = jobs.request(clean_tree, tmp_path / "ds", images={"size": 40}, workers=workers)
    dest = stage(req).dest
    assert sorted(names) == ["classes.json", "labels.npy"]  # images.npy was hashed during the decode
    monkeypatch.undo()
    assert_manifest_holds_the_files_hashes(dest)


@pytest.mark.slow
def test_a_run_interrupted_mid_decode_hashes_the_earlier_rows_on_resume(
    clean_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finalize, "HASH_BLOCK", 4096)
    base = jobs.request(clean_tree, tmp_path / "ds", images={"size": 40}, workers=2)
    crash_on(monkeypatch, "chunk", 5)
    with pytest.raises(KeyboardInterrupt):
        stage(base)
    monkeypatch.undo()
    names = hashed_files(monkeypatch)
    resumed = stage(base)
    assert "resuming an unfinished run" in resumed.notes
    assert "images.npy" not in names
    monkeypatch.undo()
    straight = stage(dataclasses.replace(base, dest=str(tmp_path / "straight"))).dest
    assert_manifest_holds_the_files_hashes(resumed.dest)
    assert sha256(resumed.dest / "images.npy") == sha256(straight / "images.npy")


@pytest.mark.slow
def test_with_rejects_the_compacted_file_is_hashed_after(photo_tree: Path, tmp_path: Path) -> None:
    req = jobs.request(photo_tree, tmp_path / "ds", images={"size": 40}, workers=2, max_rejects="10")
    dest = stage(req).dest
    assert_manifest_holds_the_files_hashes(dest)
