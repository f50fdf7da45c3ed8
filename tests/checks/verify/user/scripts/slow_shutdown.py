"""Steps of 0.2 s; on SIGINT it takes a few seconds to end, as a DataLoader's workers shutting down do. Writes
``MARK.stepped`` after 4 steps and ``MARK.closing`` when it starts to shut down."""

import sys
import time

import torch
from torch import nn

mark = sys.argv[1]
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
try:
    while True:
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.2)
        step += 1
        if step == 4:
            open(mark + ".stepped", "w").close()
except KeyboardInterrupt:
    open(mark + ".closing", "w").close()
    time.sleep(4.0)  # the workers' shutdown: the user presses Ctrl-C again meanwhile
