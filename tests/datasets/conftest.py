"""Shared trees of real photos (built once per session) and a small real filesystem for disk-full tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.datasets.photos import image_tree, plant_bad_files


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 24 re-encoded photos, plus planted broken files in ``cat``: 77 inputs, 5 rejects."""
    root = image_tree(tmp_path_factory.mktemp("photos") / "train", per_class=24)
    plant_bad_files(root / "cat")
    return root


@pytest.fixture(scope="session")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred real photos (3 classes x 100) with 5 planted broken files."""
    root = image_tree(tmp_path_factory.mktemp("big") / "photos", per_class=100)
    plant_bad_files(root / "dog")
    return root


@pytest.fixture
def source_copy(photo_tree: Path, tmp_path: Path) -> Path:
    """A private copy of ``photo_tree`` that a test may change."""
    return Path(shutil.copytree(photo_tree, tmp_path / "src"))


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 24 MiB tmpfs (needs root and mount rights; skipped elsewhere), unmounted afterwards."""
    point = tmp_path / "small"
    point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def ext4_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 MiB ext4 filesystem on a loop device (needs root; skipped elsewhere), unmounted afterwards."""
    if os.geteuid() != 0 or not (shutil.which("mkfs.ext4") and shutil.which("mount")):
        pytest.skip("a loop-mounted ext4 needs root, mkfs.ext4 and mount")
    image, point = tmp_path / "disk.img", tmp_path / "ext4"
    point.mkdir()
    with image.open("wb") as fh:
        fh.truncate(64 * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    done = (
        made
        if made.returncode
        else subprocess.run(["mount", "-o", "loop", str(image), str(point)], capture_output=True)
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a loop ext4 here: {done.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)  # -o loop: the loop device is released with it
