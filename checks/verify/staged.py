"""Staged data as verify reads it before anything runs: validation of a stage-data directory, and its description.

numpy only, no torch: the parent validates a staged directory before it starts the training script (a broken one
is a one-line error and exit 2); ``templates/train.py`` reads the same layouts.

Staged layouts (invoke stage-data's output): ``images.npy`` (uint8 N x S x S x 3) + ``labels.npy`` (int64) +
``classes.json`` + ``manifest.json``; or ``tokens.npy`` (uint16/uint32) + ``doc_offsets.npy`` + ``manifest.json``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from checks.verify.contract import DataSpec

SYNTHETIC_SAMPLES = 1_000_000  # generated on demand; large enough that a run never wraps an epoch
SYNTHETIC_VOCAB = 256  # byte-level, as stage-data's default tokenizer


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
