"""Saves model and optimizer state after every step, like a script that checkpoints far too often."""

import os
import sys
import tempfile

import torch
from torch import nn

out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(512, 1024), torch.randint(0, 8, (512,))), batch_size=4
)

step = 0
while True:
    for xb, yb in data:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        path = os.path.join(out, "last.pt")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
        os.fsync(os.open(path, os.O_RDONLY))
