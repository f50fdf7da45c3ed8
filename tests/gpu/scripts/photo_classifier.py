"""A user's image classifier as people write it: JPEGs decoded and augmented with PIL in the DataLoader, a small
ResNet on the GPU under bf16 autocast. With the default ``--workers 0`` the loader decodes in the training process.

    python tests/gpu/scripts/photo_classifier.py PHOTOS_DIR [--workers N] [--batch B] [--size PX] [--epochs E]

PHOTOS_DIR is an ImageFolder tree (``class*/NNNNN.jpg``; ``tests/gpu/prepare.py photos`` writes one). The GPU
acceptance run judges it with ``invoke verify -- python ...``; it runs unchanged on a CPU (slowly).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class Photos(Dataset):
    def __init__(self, root: Path, size: int) -> None:
        self.files = sorted(root.glob("*/*.jpg"))
        classes = sorted({f.parent.name for f in self.files})
        self.label = {name: i for i, name in enumerate(classes)}
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.files[i]
        im = Image.open(path).convert("RGB")
        side = random.randint(min(im.size) // 2, min(im.size))  # random resized crop, then flip
        x, y = random.randint(0, im.width - side), random.randint(0, im.height - side)
        im = im.crop((x, y, x + side, y + side)).resize((self.size, self.size), Image.Resampling.BILINEAR)
        if random.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = (np.asarray(im, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()), self.label[path.parent.name]


def block(cin: int, cout: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        block(64, 64, 1),
        block(64, 128, 2),
        block(128, 256, 2),
        block(256, 512, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("photos", type=Path)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=1000)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = Photos(args.photos, args.size)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers, drop_last=True)
    net = model(len(data.label)).to(device).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    for epoch in range(args.epochs):
        for x, y in loader:
            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
