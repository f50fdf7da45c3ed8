"""Saves after every step with the writer named on the command line, into the folder named after it:

``torch-buffer``: ``torch.save`` into a BytesIO, then the buffer written to a file (Lightning's path, by hand;
atomically: verify's SIGINT is held during the save, not during the script's own write);
``safetensors``: ``safetensors.torch.save_file`` of the state dict; ``safetensors-model``: ``save_model``;
``dcp``: ``torch.distributed.checkpoint.save`` (one process, no process group); ``accelerate``:
``Accelerator.save_state`` (model as safetensors, optimizer, RNG states: one save of several files).
"""

import io
import os
import sys

import torch
from torch import nn

writer, out = sys.argv[1], sys.argv[2]
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(512, 256), torch.randint(0, 8, (512,))), batch_size=8
)
accelerator = None
if writer == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, opt, data = accelerator.prepare(model, opt, data)


def save(step: int) -> None:
    if writer == "torch-buffer":
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, buffer)
        with open(os.path.join(out, "last.ckpt.tmp"), "wb") as f:  # verify's stop may come in the middle
            f.write(buffer.getvalue())
        os.replace(os.path.join(out, "last.ckpt.tmp"), os.path.join(out, "last.ckpt"))
    elif writer == "safetensors":
        from safetensors.torch import save_file

        save_file(model.state_dict(), os.path.join(out, "model.safetensors"))
    elif writer == "safetensors-model":
        from safetensors.torch import save_model

        save_model(model, os.path.join(out, "model.safetensors"))
    elif writer == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=os.path.join(out, "dcp"))
    elif writer == "accelerate":
        assert accelerator is not None  # made above for this writer
        accelerator.save_state(os.path.join(out, "state"))


step = 0
while True:
    for xb, yb in data:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        if accelerator is not None:
            accelerator.backward(loss)
        else:
            loss.backward()
        opt.step()
        step += 1
        save(step)
