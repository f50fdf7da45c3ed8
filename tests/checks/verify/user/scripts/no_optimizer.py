"""Imports torch but updates its weights by hand: no torch optimizer step ever happens."""

import time

import torch

w = torch.zeros(4, requires_grad=True)
while True:
    loss = (w - 1).pow(2).sum()
    loss.backward()
    grad = w.grad
    assert grad is not None
    with torch.no_grad():
        w -= 0.1 * grad
        w.grad = None
    time.sleep(0.01)  # a loop that also waits on something: it need not spin a core until verify gives up
