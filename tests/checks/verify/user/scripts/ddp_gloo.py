"""A DDP script launched with torchrun (gloo on the CPU), each rank with its DistributedSampler.

``--slow-rank N``: rank N reads each sample 1 ms slower (a shard on a slower disk), a straggler to find.
``--wide N``: a hidden layer N wide (64 -> N -> 4): its gradients, not its math, make the step."""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Shard(Dataset):
    def __init__(self, slow: bool) -> None:
        self.x, self.y, self.slow = torch.randn(2048, 64), torch.randint(0, 4, (2048,)), slow

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.slow:
            time.sleep(0.001)
        return self.x[i], self.y[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--wide", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = Shard(dist.get_rank() == args.slow_rank)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(64, args.wide), nn.ReLU(), nn.Linear(args.wide, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(1000):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
