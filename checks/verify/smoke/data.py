"""The smoke test's data: staged-directory validation, the built-in datasets and a resumable batch order.

numpy only, no torch: the parent validates a staged directory before it starts the child (a broken one is a
one-line error and exit 2), and DataLoader takes any object with ``__len__``/``__getitem__``. Items are numpy
arrays, which the default collate turns into tensors:

- images: ``(uint8 [S, S, 3], int label)``; the model normalises on the device, so the host-to-device copy
  moves bytes, not floats (docs/sources.md#h2d-uint8).
- tokens: ``(int64 [T], int64 [T])``, input and the same window shifted by one.

Staged layouts (issue 4's stage-data output): ``images.npy`` (uint8 N x S x S x 3) + ``labels.npy`` (int64) +
``classes.json`` + ``manifest.json``; or ``tokens.npy`` (uint16/uint32) + ``doc_offsets.npy`` + ``manifest.json``.
Arrays are memory-mapped lazily in each process, so a spawn/forkserver worker receives a path, not a copy.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from checks.verify.contract import DataSpec

SYNTHETIC_SAMPLES = 1_000_000  # generated on demand; large enough that a run never wraps an epoch
SYNTHETIC_VOCAB = 256  # byte-level, as stage-data's default tokenizer
_TEMPLATE_CELLS = 8  # class patterns are 8 x 8 blocks scaled up: learnable within a few dozen steps


# The suffixes stage-data decodes (datasets/images.py IMAGE_SUFFIXES; verify may not import datasets).
RAW_IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
_RAW_LOOK = 64  # entries looked at per folder: an ImageNet class folder holds ~1,300


class StagedDataError(ValueError):
    """A staged directory that cannot be used: the message names the file and what is wrong; ``hint`` the fix."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def synthetic_spec(kind: str, image_size: int, classes: int, seq_len: int) -> DataSpec:
    """Describe synthetic data of the given shape."""
    if kind == "images":
        return DataSpec("images", "synthetic", SYNTHETIC_SAMPLES, image_size=image_size, classes=classes)
    return DataSpec("tokens", "synthetic", SYNTHETIC_SAMPLES, seq_len=seq_len, vocab=SYNTHETIC_VOCAB)


def _load(path: Path, name: str) -> np.ndarray:
    file = path / name
    if not file.is_file():
        raise StagedDataError(f"{file} is missing")
    try:
        return np.load(file, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise StagedDataError(f"{file} is not a readable .npy array: {exc}") from None


def _manifest(path: Path) -> dict[str, Any]:
    file = path / "manifest.json"
    if not file.is_file():
        raise StagedDataError(f"{file} is missing (an incomplete or interrupted staging?)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StagedDataError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise StagedDataError(f"{file} must hold a JSON object")
    return data


def inspect_staged(path: Path, seq_len: int) -> DataSpec:
    """Validate a staged directory (manifest, arrays, shapes, dtypes, label range) and describe it."""
    if not path.is_dir():
        raise StagedDataError(f"{path} is not a directory")
    if not (path / "manifest.json").exists() and _raw_images(path):
        raise StagedDataError(
            f"{path} holds image files, not a staged dataset: verify --data reads stage-data's output",
            hint=f"stage it first: invoke stage-data --source {path}, then verify --data the folder it prints",
        )
    manifest = _manifest(path)
    if (path / "images.npy").exists():
        return _inspect_images(path)
    if (path / "tokens.npy").exists():
        return _inspect_tokens(path, seq_len, manifest)
    raise StagedDataError(f"{path} holds neither images.npy nor tokens.npy (verify reads stage-data's npy layout)")


def _raw_images(path: Path) -> bool:
    """Image files in ``path`` or in its class folders (an ImageFolder), looking at a few entries of each."""
    folders = [path]
    for entry in _first_entries(path):
        if entry.is_file() and entry.suffix.lower() in RAW_IMAGE_SUFFIXES:
            return True
        if entry.is_dir():
            folders.append(entry)
    return any(
        e.is_file() and e.suffix.lower() in RAW_IMAGE_SUFFIXES
        for folder in folders[1:8]
        for e in _first_entries(folder)
    )


def _first_entries(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as found:
            return [Path(e.path) for e in itertools.islice(found, _RAW_LOOK)]
    except OSError:
        return []


def _inspect_images(path: Path) -> DataSpec:
    images, labels = _load(path, "images.npy"), _load(path, "labels.npy")
    if images.ndim != 4 or images.shape[3] != 3 or images.shape[1] != images.shape[2] or images.dtype != np.uint8:
        raise StagedDataError(f"{path / 'images.npy'} must be uint8 N x S x S x 3, is {images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(images):
        raise StagedDataError(f"{path / 'labels.npy'} must be {len(images)} integers, is {labels.dtype} {labels.shape}")
    if len(images) == 0:
        raise StagedDataError(f"{path / 'images.npy'} holds no images")
    low, high = int(labels.min()), int(labels.max())
    classes = _classes(path, high + 1)
    if low < 0 or high >= classes:
        raise StagedDataError(f"{path / 'labels.npy'} has labels {low}..{high} outside 0..{classes - 1}")
    return DataSpec("images", "staged", len(images), str(path), image_size=images.shape[1], classes=classes)


def _classes(path: Path, seen: int) -> int:
    file = path / "classes.json"
    if not file.exists():
        return seen
    try:
        names = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StagedDataError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(names, (list, dict)):
        raise StagedDataError(f"{file} must list the class names")
    return len(names)


def _inspect_tokens(path: Path, seq_len: int, manifest: dict[str, Any]) -> DataSpec:
    tokens, offsets = _load(path, "tokens.npy"), _load(path, "doc_offsets.npy")
    if tokens.ndim != 1 or tokens.dtype not in (np.uint16, np.uint32):
        raise StagedDataError(f"{path / 'tokens.npy'} must be 1-D uint16 or uint32, is {tokens.dtype} {tokens.shape}")
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or (len(offsets) and int(offsets[-1]) > len(tokens)):
        raise StagedDataError(f"{path / 'doc_offsets.npy'} must be 1-D offsets into tokens.npy")
    windows = (len(tokens) - 1) // seq_len
    if windows < 1:
        raise StagedDataError(f"{path / 'tokens.npy'} holds {len(tokens)} tokens: fewer than one window of {seq_len}")
    # The vocabulary decides the embedding size: the manifest's figure, else the largest token + 1 (one pass).
    vocab = manifest.get("vocab_size") or manifest.get("vocab")
    vocab = int(vocab) if isinstance(vocab, int) and vocab > 0 else int(tokens.max()) + 1
    return DataSpec("tokens", "staged", windows, str(path), seq_len=seq_len, vocab=vocab)


class SyntheticImages:
    """Class-patterned noise: label ``i % classes``; the same index always gives the same bytes."""

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        rng = np.random.default_rng([seed, 7])
        cells = rng.integers(0, 256, (spec.classes, _TEMPLATE_CELLS, _TEMPLATE_CELLS, 3), dtype=np.uint8)
        scale = -(-spec.image_size // _TEMPLATE_CELLS)
        big = cells.repeat(scale, axis=1).repeat(scale, axis=2)
        self.templates = big[:, : spec.image_size, : spec.image_size] // 2

    def __len__(self) -> int:
        return self.spec.samples

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        label = int(i) % self.spec.classes
        noise = np.random.default_rng([self.seed, int(i)]).integers(0, 128, self.templates.shape[1:], dtype=np.uint8)
        return self.templates[label] + noise, label


class SyntheticTokens:
    """A sparse Markov chain (4 likely successors per token): loss falls from ln(256) towards ln(4)."""

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self.successors = np.random.default_rng([seed, 11]).integers(0, spec.vocab, (spec.vocab, 4))

    def __len__(self) -> int:
        return self.spec.samples

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, int(i)])
        picks = rng.integers(0, 4, self.spec.seq_len + 1)
        seq = np.empty(self.spec.seq_len + 1, dtype=np.int64)
        seq[0] = rng.integers(0, self.spec.vocab)
        for t in range(1, len(seq)):
            seq[t] = self.successors[seq[t - 1], picks[t]]
        return seq[:-1], seq[1:]


class _Lazy:
    """Open memory maps on first use in each process; pickle as the path only."""

    files: tuple[str, ...] = ()

    def __init__(self, spec: DataSpec) -> None:
        self.spec = spec
        self._arrays: dict[str, np.ndarray] | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {name: np.load(Path(self.spec.path) / name, mmap_mode="r") for name in self.files}
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "_arrays": None}

    def __len__(self) -> int:
        return self.spec.samples


class StagedImages(_Lazy):
    files = ("images.npy", "labels.npy")

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        a = self.arrays()
        return np.array(a["images.npy"][i]), int(a["labels.npy"][i])


class StagedTokens(_Lazy):
    files = ("tokens.npy",)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start = int(i) * self.spec.seq_len
        window = np.asarray(self.arrays()["tokens.npy"][start : start + self.spec.seq_len + 1], dtype=np.int64)
        return window[:-1], window[1:]


def make_dataset(spec: DataSpec, seed: int) -> Any:
    """Build the dataset ``spec`` describes; staged images through stage-data's own template when it is there."""
    if spec.source == "staged" and spec.kind == "images":
        return template_images(spec) or StagedImages(spec)
    if spec.source == "staged":
        return StagedTokens(spec)
    return SyntheticImages(spec, seed) if spec.kind == "images" else SyntheticTokens(spec, seed)


def template_images(spec: DataSpec) -> Any | None:
    """``templates/staged_dataset.py``'s StagedImages: the Dataset users are told to copy, so verify trains through
    the same code; None when the template is missing or does not fit (the built-in reader takes over)."""
    try:
        from templates.staged_dataset import StagedImages as Template

        dataset = Template(spec.path)
        if len(dataset) != spec.samples:
            return None
    except Exception:  # noqa: BLE001 - a template of another shape is not an error: the built-in reader works
        return None
    return dataset


class EpochBatches:
    """A DataLoader ``batch_sampler``: a seeded permutation per epoch, cut into full batches, startable mid-epoch.

    ``(seed, epoch, start)`` is the sampler position a checkpoint stores: a loader rebuilt from it yields exactly
    the batches the uninterrupted run would have (the seed article §4.4: restore the seed and the data order, or
    the metrics jump after a resume).
    """

    def __init__(self, samples: int, batch_size: int, seed: int, epoch: int = 0, start: int = 0) -> None:
        if samples < batch_size:
            raise StagedDataError(f"the dataset holds {samples} samples: fewer than one batch of {batch_size}")
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return self.samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.samples)
        first, self.start = self.start, 0  # a resume offset applies to the epoch it was saved in only
        for b in range(first, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
