"""The smoke loop's datasets read a batch at once (``__getitems__``) exactly as they read it one index at a time.

DataLoader calls ``dataset.__getitems__(batch_indices)`` when it exists, then collates the list it returns; the
checkpoint check replays batches bit for bit, so a batch read at once must hold the very samples ``__getitem__``
gives. The DataLoader tests take the ``torch`` fixture, so the rest runs where torch is missing.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from checks.verify.smoke.data import (
    EpochBatches,
    StagedImages,
    StagedTokens,
    SyntheticImages,
    SyntheticTokens,
    inspect_staged,
    synthetic_spec,
)

# Unsorted, repeated, first and last: what a shuffled batch sampler (or a wrapped epoch) can ask for.
INDICES = [7, 0, 3, 7, 1, 9, 3, 2]


@pytest.fixture
def torch() -> ModuleType:
    return pytest.importorskip("torch")


def staged_images(root: Path, n: int = 10, side: int = 6) -> Path:
    root.mkdir(parents=True)
    np.save(root / "images.npy", np.random.default_rng(1).integers(0, 256, (n, side, side, 3), dtype=np.uint8))
    np.save(root / "labels.npy", (np.arange(n, dtype=np.int64) * 7) % 3)
    (root / "classes.json").write_text(json.dumps(["a", "b", "c"]))
    (root / "manifest.json").write_text(json.dumps({"count": n}))
    return root


def staged_tokens(root: Path, dtype: Any, tokens: int = 101) -> Path:
    root.mkdir(parents=True)
    np.save(root / "tokens.npy", np.random.default_rng(2).integers(0, 300, tokens).astype(dtype))
    np.save(root / "doc_offsets.npy", np.array([0, tokens // 2, tokens], dtype=np.int64))
    (root / "manifest.json").write_text(json.dumps({}))
    return root


# Each builds a dataset of at least 10 samples; odd shapes on purpose (a 10 px image is 300 bytes, not whole words).
DATASETS: dict[str, Callable[[Path], Any]] = {
    "synthetic-images-16px": lambda _: SyntheticImages(synthetic_spec("images", 16, 10, 0), seed=3),
    "synthetic-images-10px": lambda _: SyntheticImages(synthetic_spec("images", 10, 4, 0), seed=4),
    "synthetic-tokens": lambda _: SyntheticTokens(synthetic_spec("tokens", 0, 0, 32), seed=3),
    "synthetic-tokens-odd": lambda _: SyntheticTokens(synthetic_spec("tokens", 0, 0, 7), seed=5),
    "staged-images": lambda d: StagedImages(inspect_staged(staged_images(d / "img"), 10)),
    "staged-tokens-u16": lambda d: StagedTokens(inspect_staged(staged_tokens(d / "u16", np.uint16), 10)),
    "staged-tokens-u32": lambda d: StagedTokens(inspect_staged(staged_tokens(d / "u32", np.uint32), 10)),
}


def assert_same_sample(got: Any, want: Any) -> None:
    assert type(got) is type(want) and len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w)
        if isinstance(w, np.ndarray):
            assert (g.dtype, g.shape) == (w.dtype, w.shape) and np.array_equal(g, w)
            assert g.flags.writeable  # torch.as_tensor warns on read-only arrays (a memory map's rows)
        else:
            assert g == w


@pytest.mark.parametrize("name", DATASETS)
def test_a_batch_read_at_once_holds_the_samples_read_one_by_one(tmp_path: Path, name: str) -> None:
    ds = DATASETS[name](tmp_path)
    batch = ds.__getitems__(INDICES)
    assert len(batch) == len(INDICES)
    for got, i in zip(batch, INDICES, strict=True):
        assert_same_sample(got, ds[i])
    assert ds.__getitems__([]) == []
    again = pickle.loads(pickle.dumps(ds))  # a worker's copy: staged data re-opens its maps from the path
    for got, i in zip(again.__getitems__(INDICES[::-1]), INDICES[::-1], strict=True):
        assert_same_sample(got, ds[i])


@pytest.mark.parametrize("name", ["staged-images", "staged-tokens-u16"])
def test_staged_data_still_pickles_as_a_path_after_a_batch_read(tmp_path: Path, name: str) -> None:
    ds = DATASETS[name](tmp_path)
    ds.__getitems__(INDICES)  # the memory maps are open now
    assert len(pickle.dumps(ds)) < 1000


class OneByOne:
    """The dataset without ``__getitems__``: DataLoader falls back to one ``__getitem__`` per index."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


@pytest.mark.parametrize("name", DATASETS)
def test_the_dataloader_yields_the_same_batches_with_and_without_getitems(
    torch: ModuleType, tmp_path: Path, name: str
) -> None:
    ds = DATASETS[name](tmp_path)
    samples = min(len(ds), 40)

    def batches(dataset: Any) -> list[Any]:
        sampler = EpochBatches(samples, 4, seed=1, epoch=0)
        return list(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=0))

    at_once, one_by_one = batches(ds), batches(OneByOne(ds))
    assert len(at_once) == len(one_by_one) == samples // 4
    for a, b in zip(at_once, one_by_one, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and torch.equal(x, y)


def test_synthetic_tokens_are_the_per_index_draws_they_always_were() -> None:
    """``__getitem__`` reads through the batch code: pin it to the plain per-index recipe (the windows the tool made
    before batches were read at once), so that a batch is not merely consistent with itself."""
    for seq_len, count in ((7, 8), (7, 40)):  # fewer rows than _NUMPY_WALK take Python steps, more take numpy's
        tokens = SyntheticTokens(synthetic_spec("tokens", 0, 0, seq_len), seed=5)
        indices = [(13 * k) % 97 for k in range(count)]
        for i, (x, y) in zip(indices, tokens.__getitems__(indices), strict=True):
            rng = np.random.default_rng([5, i])
            picks = rng.integers(0, 4, seq_len + 1)
            seq = [int(rng.integers(0, 256))]
            for t in range(1, seq_len + 1):
                seq.append(int(tokens.successors[seq[-1], picks[t]]))
            assert x.tolist() == seq[:-1] and y.tolist() == seq[1:]


def test_synthetic_images_are_class_templates_plus_per_index_noise() -> None:
    spec = synthetic_spec("images", 16, 10, 0)
    images, same, other = SyntheticImages(spec, seed=3), SyntheticImages(spec, seed=3), SyntheticImages(spec, seed=4)
    batch = images.__getitems__(list(range(50)))
    for i, (image, label) in enumerate(batch):
        assert label == i % 10 and image.shape == (16, 16, 3) and image.dtype == np.uint8
        noise = image.astype(np.int64) - images.templates[label]
        assert noise.min() >= 0 and noise.max() <= 127 and len(np.unique(noise)) > 64
    assert len({image.tobytes() for image, _ in batch}) == 50  # no two indices share their noise
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(batch, same.__getitems__(list(range(50))), strict=True))
    assert not np.array_equal(batch[0][0], other[0][0])  # the seed changes the noise
    mean = np.mean([image.astype(np.int64) - images.templates[label] for image, label in batch])
    assert 60 < mean < 67  # uniform over 0..127: mean 63.5
