"""A loop that uses verify's cooperating marks: it asks ``should_stop()`` every step and leaves its loop cleanly
(its own last line, exit 0), and every 4 steps runs an evaluation of 0.3 s marked ``phase("eval")``."""

import contextlib
import sys
import time

import torch

agent = sys.modules.get("_gpu_preflight_agent")
should_stop = getattr(agent, "should_stop", lambda: False)
phase = getattr(agent, "phase", None) or (lambda name: contextlib.nullcontext())

torch.manual_seed(0)
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
step = 0
while not should_stop():
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    time.sleep(0.02)  # a step of some length
    if step % 4 == 0:
        with phase("eval"), torch.no_grad():
            model(x)
            time.sleep(0.3)  # an evaluation: no training step
    if step >= 2000:
        sys.exit("never asked to stop")
print(f"left the loop at step {step}", flush=True)
