"""The smoke test's data: staged-directory validation, the built-in datasets and a resumable batch order.

numpy only, no torch: the parent validates a staged directory before it starts the child (a broken one is a
one-line error and exit 2), and DataLoader takes any object with ``__len__``/``__getitem__``. Items are numpy
arrays, which the default collate turns into tensors:

- images: ``(uint8 [S, S, 3], int label)``; the model normalises on the device, so the host-to-device copy
  moves bytes, not floats (docs/sources.md#h2d-uint8).
- tokens: ``(int64 [T], int64 [T])``, input and the same window shifted by one.

Staged layouts (invoke stage-data's output): ``images.npy`` (uint8 N x S x S x 3) + ``labels.npy`` (int64) +
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


FEWER_THAN_A_BATCH = "pass a smaller --batch-size (it is per rank), or give it more samples"


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


_NOISE_POOL = 1 << 20  # offsets into one seeded noise pool: a sample's noise is the pool's bytes from its offset
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _hash(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic): well-spread offsets from indices."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SyntheticImages:
    """Class-patterned noise: label ``i % classes``; the same index always gives the same bytes.

    Image i is its class template (0..127) plus noise (0..127): the bytes of a seeded pool from an offset hashed
    from ``(seed, i)``. A batch is one fancy-index copy out of the pool, well under a millisecond for 256 images of
    64 px: a generator per index (``default_rng([seed, i])``, ~10 us to seed before a byte is drawn) made the smoke
    loop wait for its own data on an H200.
    """

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        rng = np.random.default_rng([seed, 7])
        cells = rng.integers(0, 256, (spec.classes, _TEMPLATE_CELLS, _TEMPLATE_CELLS, 3), dtype=np.uint8)
        scale = -(-spec.image_size // _TEMPLATE_CELLS)
        big = cells.repeat(scale, axis=1).repeat(scale, axis=2)
        self.templates = big[:, : spec.image_size, : spec.image_size] // 2
        noise = np.random.default_rng([seed, 13])
        self.pool = noise.integers(0, 128, _NOISE_POOL + self.templates[0].size, dtype=np.uint8)
        self.salt = np.uint64(noise.integers(0, 2**63))

    def __len__(self) -> int:
        return self.spec.samples

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, int]]:
        """A batch's samples at once (DataLoader calls this with a batch's indices): the same as one by one."""
        labels = [int(i) % self.spec.classes for i in indices]
        offsets = _hash(np.asarray(indices, dtype=np.uint64) + self.salt) % np.uint64(_NOISE_POOL + 1)
        windows = np.lib.stride_tricks.sliding_window_view(self.pool, self.templates[0].size)
        images = windows[offsets.astype(np.intp)].reshape(len(indices), *self.templates.shape[1:])
        images += self.templates[labels]  # at most 127 + 127: never wraps
        return list(zip(images, labels, strict=True))


class SyntheticTokens:
    """A sparse Markov chain (4 likely successors per token): loss falls from ln(256) towards ln(4)."""

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self.successors = np.random.default_rng([seed, 11]).integers(0, spec.vocab, (spec.vocab, 4))

    def __len__(self) -> int:
        return self.spec.samples

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """A batch's windows at once: each sample's draws come from its own index's generator, as one by one; the
        chain then steps the whole batch together (a numpy take per position, not a Python step per token)."""
        steps = self.spec.seq_len + 1
        picks = np.empty((len(indices), steps), dtype=np.int64)
        first = np.empty(len(indices), dtype=np.int64)
        for b, i in enumerate(indices):
            rng = np.random.default_rng([self.seed, int(i)])
            picks[b] = rng.integers(0, 4, steps)
            first[b] = rng.integers(0, self.spec.vocab)
        rows = _walk(self.successors, first, picks)
        return [(row[:-1], row[1:]) for row in rows]


_NUMPY_WALK = 32  # rows from which a numpy call per position beats Python steps per token (~20 us a row)


def _walk(successors: np.ndarray, first: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Markov chains, one per row: ``seq[:, 0] = first``, ``seq[:, t] = successors[seq[:, t - 1], picks[:, t]]``."""
    width = successors.shape[1]
    if len(first) < _NUMPY_WALK:  # __getitem__, small batches: numpy's per-call cost would dominate
        table, rows = successors.reshape(-1).tolist(), []
        for token, row in zip(first.tolist(), picks[:, 1:].tolist(), strict=True):
            walk = [token]
            for pick in row:
                token = table[width * token + pick]
                walk.append(token)
            rows.append(walk)
        return np.array(rows, dtype=np.int64).reshape(picks.shape)
    # Position-major, and tokens kept times the width, so that each position is one add and one take of a row.
    table, steps = (successors * width).reshape(-1), np.ascontiguousarray(picks.T)
    seq = np.empty_like(steps)
    seq[0] = first * width
    for t in range(1, len(seq)):
        np.add(seq[t - 1], steps[t], out=seq[t])
        np.take(table, seq[t], out=seq[t])
    seq //= width
    return np.ascontiguousarray(seq.T)


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

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, int]]:
        """One fancy-index read of the memory map per batch (a copy, rows in the order asked, repeats included)."""
        a, rows = self.arrays(), np.asarray(indices, dtype=np.intp)
        return list(zip(np.asarray(a["images.npy"][rows]), a["labels.npy"][rows].tolist(), strict=True))


class StagedTokens(_Lazy):
    files = ("tokens.npy",)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start = int(i) * self.spec.seq_len
        window = np.asarray(self.arrays()["tokens.npy"][start : start + self.spec.seq_len + 1], dtype=np.int64)
        return window[:-1], window[1:]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """One fancy-index read per batch: window i is tokens[i * seq_len : (i + 1) * seq_len + 1], as one by one."""
        seq_len = self.spec.seq_len
        windows = np.lib.stride_tricks.sliding_window_view(self.arrays()["tokens.npy"], seq_len + 1)[::seq_len]
        rows = windows[np.asarray(indices, dtype=np.intp)].astype(np.int64)
        return [(row[:-1], row[1:]) for row in rows]


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
            raise StagedDataError(
                f"the dataset holds {samples} samples: fewer than one batch of {batch_size}", hint=FEWER_THAN_A_BATCH
            )
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return self.samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.samples)
        first, self.start = self.start, 0  # a resume offset applies to the epoch it was saved in only
        for b in range(first, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
