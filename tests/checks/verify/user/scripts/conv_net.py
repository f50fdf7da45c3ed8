"""A small conv net trained as users write it: synthetic 64 px images in a TensorDataset, a DataLoader, Adam,
fp32 on the CPU. ``--batch-size`` and ``--steps`` as most training scripts have them."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--steps", type=int, default=10_000)
args = parser.parse_args()

torch.manual_seed(0)
images = torch.randn(1024, 3, 64, 64)
labels = (images.mean(dim=(1, 2, 3)) > 0).long()  # learnable: the sign of the mean pixel
loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2),
)  # fmt: skip
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

step = 0
while step < args.steps:
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.steps:
            break
print(f"trained {step} steps, last loss {loss.item():.3f}")
