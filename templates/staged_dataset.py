"""A PyTorch Dataset over a folder written by ``invoke stage-data`` (copy this file into your project).

images.npy is memory-mapped, opened lazily in each DataLoader worker: a sample costs one copy of its pixels
(into the batch) instead of a JPEG decode. Samples stay HWC uint8 as stored; convert on the GPU, where it is
free: ``x.cuda(non_blocking=True).permute(0, 3, 1, 2).float().div_(255)``. Needs numpy and torch only.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class StagedImages(Dataset):
    """(uint8 SxSx3 image tensor, int label) pairs from images.npy, labels.npy and classes.json."""

    def __init__(self, root: str | Path, transform: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")
        self.classes = json.loads((self.root / "classes.json").read_text())
        self.transform = transform
        self._images: np.ndarray | None = None  # opened on first use, in the worker process that reads it

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self._images is None:  # "c": copy-on-write, so tensors may view the map; the file is never written
            self._images = np.load(self.root / "images.npy", mmap_mode="c")
        image = torch.from_numpy(self._images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])
