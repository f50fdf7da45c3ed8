"""A small MLP trained under bf16 autocast on the CPU (on a GPU it would be CUDA's): verify reads the precision
from autocast and counts one step's matrix FLOPs. Batch 64, 256 -> 512 -> 10."""

import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for _step in range(1_000_000):
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(net(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
