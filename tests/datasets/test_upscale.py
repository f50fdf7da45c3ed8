"""``--size`` larger than the source photos: staged as asked, and said before the work with the figures."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from checks.units import size_binary
from datasets.inventory import scan
from datasets.stage import stage
from datasets.upscale import warning
from tests.datasets import jobs
from tests.datasets.photos import PHOTOS, encode, photo
from tests.datasets.test_inventory import CONFIGURED


def small_photos(root: Path, width: int = 64, height: int = 48) -> Path:
    """Two classes of three real photos each, shrunk to ``width`` x ``height`` (short side ``height``)."""
    for k, name in enumerate(PHOTOS[:6]):
        folder = root / ("a" if k < 3 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{Path(name).stem}.jpg").write_bytes(encode(photo(name).resize((width, height)), quality=90))
    return root


def test_a_size_above_the_photos_is_said_before_the_work_with_its_figures(tmp_path: Path) -> None:
    """--size 4096 made 1.1 GiB of small photos without a word before; here 256 px from 48 px photos."""
    said: list[str] = []
    src = small_photos(tmp_path / "src")
    req = jobs.request(src, tmp_path / "ds", images={"size": 256}, workers=1)
    out = stage(req, say=said.append)
    assert out.manifest.contents.counts.staged == 6
    assert np.load(out.dest / "images.npy", mmap_mode="r").shape == (6, 256, 256, 3)  # staged as asked
    [line] = [s for s in said if s.startswith("--size 256 enlarges")]
    assert "short side is 48 px" in line and "6 of 6 images read" in line, line
    assert (
        f"{size_binary(6 * 256 * 256 * 3)} in all" in line
        and f"--size 48 would take {size_binary(6 * 48 * 48 * 3)}" in line
    ), line


def test_no_word_when_the_photos_are_at_least_the_size(tmp_path: Path) -> None:
    said: list[str] = []
    src = small_photos(tmp_path / "src")
    stage(jobs.request(src, tmp_path / "ds", images={"size": 48}, workers=1), say=said.append)
    assert not [s for s in said if "enlarges" in s], said


def test_a_fetched_source_says_it_beside_the_summary(tmp_path: Path) -> None:
    """An archive is scanned only once unpacked: the line comes with the outcome's notes, after the run."""
    src = small_photos(tmp_path / "photos")
    with tarfile.open(tmp_path / "photos.tar", "w") as tar:
        tar.add(src, arcname="photos")
    out = stage(jobs.request(tmp_path / "photos.tar", tmp_path / "ds", images={"size": 128}, workers=1))
    assert [n for n in out.notes if n.startswith("--size 128 enlarges") and "short side is 48 px" in n], out.notes


@pytest.mark.parametrize(("sides", "size", "warned"), [((40, 40, 300), 256, True), ((40, 300, 300), 256, False)])
def test_the_median_photo_decides(tmp_path: Path, sides: tuple[int, ...], size: int, warned: bool) -> None:
    """A few small photos among large ones (ImageNet has some) are no reason to speak; most of them small is."""
    for k, side in enumerate(sides):
        folder = tmp_path / "c"
        folder.mkdir(exist_ok=True)
        (folder / f"{k}.jpg").write_bytes(encode(photo(PHOTOS[k]).resize((side + 10, side)), quality=80))
    line = warning(
        jobs.request(tmp_path, tmp_path / "ds", images={"size": size}).images, scan(tmp_path, "images", CONFIGURED)
    )
    assert (line is not None) == warned, line
    if line:
        assert "40-300 px (median 40 px, 3 of 3 images read)" in line
