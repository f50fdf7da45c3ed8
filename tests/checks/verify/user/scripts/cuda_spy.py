"""A small MLP training loop for the agent's GPU figures (``test_agent_gpu_figures.py``).

On the CPU (no argument) it records any call to torch's CUDA allocator and profiler functions, each a line in the
file ``CUDA_SPY_FILE`` names (none should come: the script never initialises CUDA), and writes the profile step
the launcher asked the agent for to that file's name plus ``.asked``. With ``--cuda`` it trains on the GPU, spied
on by nothing.
"""

import os
import sys

import torch
from torch import nn

cuda = "--cuda" in sys.argv
if not cuda:
    spy_file = os.environ["CUDA_SPY_FILE"]
    with open(spy_file + ".asked", "w", encoding="utf-8") as fh:
        fh.write(os.environ.get("GPU_PREFLIGHT_PROFILE_STEP", ""))

    def spy(name):
        def called(*args, **kwargs):
            with open(spy_file, "a", encoding="utf-8") as fh:
                fh.write(name + "\n")
            raise RuntimeError(f"{name} called on a CPU run")

        return called

    for name in ("memory_stats", "mem_get_info", "max_memory_reserved", "reset_peak_memory_stats", "synchronize"):
        setattr(torch.cuda, name, spy(f"torch.cuda.{name}"))
    torch.profiler.profile = spy("torch.profiler.profile")  # type: ignore[misc]

device = "cuda" if cuda else "cpu"
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(32, 64, device=device), torch.randint(0, 10, (32,), device=device)
for _step in range(1_000_000):
    loss = nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
