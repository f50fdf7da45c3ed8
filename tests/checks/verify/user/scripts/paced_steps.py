"""Optimizer steps of ``--step-s`` seconds each (a sleep: the pace holds on a busy box), forever or until
``--stop-after`` steps, after which it waits without stepping (a hung data read or collective)."""

import argparse
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--step-s", type=float, default=1.0)
parser.add_argument("--stop-after", type=int, default=0)
args = parser.parse_args()

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    if args.stop_after and step == args.stop_after:
        time.sleep(3600)  # steps stop coming: verify must call it stalled, not wait out its five minutes
    loss = model(torch.randn(8, 4)).pow(2).mean()
    time.sleep(args.step_s)
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
