"""Training over the tool's own staged_loader (templates/staged_dataset.py) as its docstring shows, with the
conversion of each batch marked as the host-to-device part (on a GPU, the ``.to(device)`` goes there)."""

import contextlib
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "templates"))  # a user copies the file instead
from staged_dataset import staged_loader

loader = staged_loader(sys.argv[1], 16, seed=0)
model = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32 * 3, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
mark = getattr(sys.modules.get("_gpu_preflight_agent"), "region", None) or contextlib.nullcontext

epoch = 0
while True:
    loader.set_epoch(epoch)
    for images, labels in loader:
        with mark("h2d"):
            x = images.permute(0, 3, 1, 2).float().div_(255)
        loss = nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    epoch += 1
