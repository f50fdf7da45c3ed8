"""A deep MLP of tiny layers: 48 blocks of Linear(64, 64) + ReLU at batch 32, SGD. On the CPU each step is a few
hundred small ops; on a GPU each would be a kernel launch longer than its math."""

import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(*[m for _ in range(48) for m in (nn.Linear(64, 64), nn.ReLU())], nn.Linear(64, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 2, (32,))
for _step in range(1_000_000):
    loss = nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
