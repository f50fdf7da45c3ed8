"""Batches whose batch dimension a first-tensor rule misreads, by the shape named on the command line:

``images``: the collate returns a list of per-image tensors [3, 32, 32] at batch 2 (the model stacks them):
2 samples a step, not 3 (an image's channels); ``tokens``: GPT-style ``(x, y)`` tensors of token ids [4, 32]:
4 samples and 128 tokens a step.
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

kind = sys.argv[1]


class Images(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.rand(3, 32, 32)


class Windows(Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 256, (10_000 + 33,), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return self.ids[i : i + 32], self.ids[i + 1 : i + 33]


if kind == "images":
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    loader = DataLoader(Images(), batch_size=2, collate_fn=list)
else:
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256))
    loader = DataLoader(Windows(), batch_size=4, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    for batch in loader:
        if kind == "images":
            loss = model(torch.stack(batch)).square().mean()
        else:
            x, y = batch
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
