"""A hand-written update rule (no torch optimizer) with verify's one-line step marker."""

import sys

import torch

w = torch.zeros(256, requires_grad=True)
x = torch.randn(512, 256)
while True:
    loss = (x @ w - 1).pow(2).mean()
    loss.backward()
    grad = w.grad
    assert grad is not None
    with torch.no_grad():
        w -= 0.01 * grad
        w.grad = None
    getattr(sys.modules.get("_gpu_preflight_agent"), "step", lambda: None)()
