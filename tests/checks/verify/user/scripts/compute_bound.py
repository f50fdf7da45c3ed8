"""A loop over tensors already in memory with a model that does real work per batch: compute-bound."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(4096, 1024)
y = torch.randint(0, 10, (4096,))
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.GELU())], nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True)

for _epoch in range(1000):
    for xb, yb in loader:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
