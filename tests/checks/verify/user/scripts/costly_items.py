"""A map-style dataset whose samples cost a known time: ``__getitem__`` sleeps 4 ms, 1 ms itself (a read, say) and
3 ms in the one step of its ``Compose``-like transform (``Tokenize``), and the collate 10 ms a batch, batch 8 and
a tiny model: data-bound. ``--workers N`` sets num_workers, ``--start fork|spawn`` the workers' start method."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

READ_S = 0.001
TRANSFORM_S = 0.003
COLLATE_S = 0.010


class Compose:
    """torchvision's shape: a ``.transforms`` list applied in order."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Tokenize:
    def __call__(self, x):
        time.sleep(TRANSFORM_S)
        return x


class Costly(Dataset):
    def __init__(self):
        self.transform = Compose([Tokenize()])

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(READ_S)
        return self.transform(torch.randn(16)), i % 2


def collate(samples):
    time.sleep(COLLATE_S)
    return default_collate(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--start", default=None)
    args = parser.parse_args()
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Costly(), batch_size=8, collate_fn=collate, num_workers=args.workers,
                        multiprocessing_context=args.start if args.workers else None)  # fmt: skip
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
