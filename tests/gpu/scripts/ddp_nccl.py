"""A user's DDP loop under torchrun on NCCL: one process per GPU, random batches made on each GPU.

    torchrun --standalone --nproc-per-node N tests/gpu/scripts/ddp_nccl.py [--width D] [--batch B]

The GPU acceptance run judges it with ``invoke verify -- torchrun ...``: it exercises the CUDA clocks of the
agent's DDP comm hook (on one GPU the all-reduce is NCCL's one-rank case).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100000)
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    net = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.width, 10)).cuda(), device_ids=[local])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, device="cuda")
        y = x[:, :10].argmax(dim=1)  # a label the model can learn: the loss falls
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(net(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 and dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
