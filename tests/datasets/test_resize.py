"""The recipe's resize: the SIMD convolution agrees with Pillow's, Pillow stands in where it is missing, and the
staged dataset records which one made its pixels (a run never mixes or skips over the other's rows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datasets import npyfile, resize
from datasets.decode import ChunkDone
from datasets.images import Resize, crop_box, decode_bytes
from datasets.journal import Journal
from datasets.run_images import _Reserve, _Unsynced
from datasets.stage import stage
from tests.datasets.jobs import request
from tests.datasets.photos import variants

ROOT = Path(__file__).resolve().parents[2]
needs_simd = pytest.mark.skipif(not resize.simd_available(), reason=f"{resize.SIMD_PACKAGE} is not installed")


def _both(size: int, resample: str = "bicubic") -> tuple[np.ndarray, np.ndarray]:
    photos = [data for _, data in variants(14)]
    simd = Resize(size, resample=resample, resizer=resize.backend_id(resample))
    pillow = Resize(size, resample=resample)
    ours = np.stack([decode_bytes(d, simd) for d in photos]).astype(np.int16)
    return ours, np.stack([decode_bytes(d, pillow) for d in photos]).astype(np.int16)


@needs_simd
@pytest.mark.parametrize(("size", "resample"), [(256, "bicubic"), (64, "bicubic"), (224, "bilinear"), (96, "lanczos")])
def test_the_simd_resize_is_pillows_within_rounding(size: int, resample: str) -> None:
    ours, pillow = _both(size, resample)
    diff = np.abs(ours - pillow)
    # Measured on these photos: mean 0.10-0.18 levels, 99.9% of pixels within 1, max 6-11 (BENCHMARKS.md,
    # "stage-data against LitData"): rounding of the same kernel, far below a training augmentation's change.
    assert diff.mean() < 0.3 and np.percentile(diff, 99.9) <= 2 and diff.max() <= 16


@needs_simd
def test_the_simd_resize_is_named_with_its_version_and_is_the_same_bytes_every_time() -> None:
    assert resize.backend_id("bicubic").startswith(f"{resize.SIMD_PACKAGE} ")
    data = variants(1)[0][1]
    spec = Resize(256, resizer=resize.backend_id("bicubic"))
    assert decode_bytes(data, spec).tobytes() == decode_bytes(data, spec).tobytes()


@pytest.mark.parametrize("resample", ["nearest", "box", "hamming"])
def test_filters_without_a_matching_simd_kernel_stay_on_pillow(resample: str) -> None:
    assert resize.backend_id(resample) == resize.PILLOW


def test_pillow_is_the_resize_and_the_recipe_is_unchanged_where_the_package_cannot_be_imported() -> None:
    script = (
        "import sys; sys.modules['cykooz_resizer'] = None\n"  # what an ImportError at import time gives
        "import json\n"
        "from datasets import resize\n"
        "print(json.dumps([resize.simd_available(), resize.backend_id('bicubic')]))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(run.stdout) == [False, resize.PILLOW]


def test_the_pillow_backend_is_exactly_pillows_resize() -> None:
    im = Image.open(__import__("io").BytesIO(variants(1)[0][1])).convert("RGB")
    box = crop_box(im.size, "crop")
    want = im.resize((100, 100), Image.Resampling.BICUBIC, box=box)
    assert resize.resize(im, 100, "bicubic", box, resize.PILLOW).tobytes() == want.tobytes()


def test_a_run_that_chose_the_simd_resize_fails_loudly_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resize, "_simd", None)
    im = Image.new("RGB", (40, 30))
    with pytest.raises(RuntimeError, match="not importable"):
        resize.resize(im, 16, "bicubic", crop_box(im.size, "crop"), f"{resize.SIMD_PACKAGE} 0")


@pytest.mark.slow
def test_the_manifest_names_the_resizer_and_another_one_restages(
    photo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = request(photo_tree, tmp_path / "ds", images={"size": 16}, max_rejects="10", workers=1)
    with monkeypatch.context() as m:
        m.setattr(resize, "_simd", None)  # as where the package is missing
        first = stage(job)
    assert first.manifest.parameters["resizer"] == resize.PILLOW
    again = stage(job)
    if not resize.simd_available():
        assert again.noop
        return
    assert not again.noop and again.notes == ("restaging: parameters changed (resizer)",)
    assert again.manifest.parameters["resizer"] == resize.backend_id("bicubic")
    assert again.manifest.fingerprint != first.manifest.fingerprint  # an unfinished run of the other is discarded


def test_decoded_chunks_are_journaled_after_one_sync_per_batch(tmp_path: Path) -> None:
    rows = tmp_path / "rows.bin"
    rows.write_bytes(b"\0" * 64)
    journal = Journal(tmp_path / "journal.jsonl")
    journal.start("f")
    unsynced = _Unsynced(rows, journal, _Reserve(tmp_path / "reserve.bin", 0, 0), rows=10)
    unsynced.add(ChunkDone(0, 4, ()), 4)
    unsynced.add(ChunkDone(8, 12, ((9, "corrupt"),)), 4)
    assert journal.all("chunk") == []  # 8 rows: under the batch, nothing journaled yet
    unsynced.add(ChunkDone(4, 8, ()), 4)
    assert [(e["start"], e["stop"]) for e in journal.all("chunk")] == [(0, 4), (8, 12), (4, 8)]
    assert journal.all("chunk")[1]["rejects"] == [[9, "corrupt"]]
    unsynced.add(ChunkDone(12, 13, ()), 4)
    unsynced.flush()
    assert len(Journal(tmp_path / "journal.jsonl").all("chunk")) == 4


def test_the_reserve_holds_the_rows_to_come_less_the_chunks_in_flight_and_shrinks_as_they_land(tmp_path: Path) -> None:
    path = tmp_path / "reserve.bin"
    reserve = _Reserve(path, 10 << 20, 2 << 20)
    assert path.stat().st_size == 8 << 20 and npyfile.allocated_bytes(path) >= 8 << 20  # blocks held, not a hole
    reserve.give_back(3 << 20)
    assert path.stat().st_size == 5 << 20 and npyfile.allocated_bytes(path) < 6 << 20
    reserve.give_back(9 << 20)
    assert path.stat().st_size == 0
    reserve.close()
    assert not path.exists()
