"""A plain loop whose Dataset does costly work in __getitem__ (num_workers=0): data-bound."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.02)  # decoding a large JPEG, say
        return torch.randn(32), i % 4


def main():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=0)
    for epoch in range(100):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("epoch", epoch)


if __name__ == "__main__":
    main()
