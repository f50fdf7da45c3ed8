"""Crashes at its third optimizer step while a DataLoader worker is alive; the worker writes its pid."""

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

PIDS = sys.argv[1]


def note_worker(_):
    with open(PIDS, "a") as fh:
        fh.write(f"{os.getpid()}\n")


def main():
    data = TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
    loader = DataLoader(data, batch_size=8, num_workers=1, worker_init_fn=note_worker)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader, 1):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step == 3:
            raise RuntimeError("boom at step 3")


if __name__ == "__main__":
    main()
