"""An MLP trained under bf16 autocast on the CPU, as a script written for a GPU box runs on a laptop: batch 128,
1024 -> 1024 x3 -> 10, SGD. Whether its bf16 is native or emulated is the CPU's (avx512_bf16/amx_bf16)."""

import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(128, 1024), torch.randint(0, 10, (128,))
for _step in range(1_000_000):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(net(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
