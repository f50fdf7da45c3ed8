"""Several processes (child side, torch): the smoke loop under DistributedDataParallel, and what it measures.

One process per GPU (NCCL), or per share of the CPU cores (gloo). Each rank reads its shard of the same seeded
order (``loop.ShardedBatches``, a batch sampler over ``DistributedSampler``), so the checkpoint's ``(seed, epoch,
batch)`` position rebuilds every rank's shard. The exchange is measured in the run itself
(docs/sources.md#ddp-exposed-comm): windows of forward+backward steps inside ``model.no_sync()``
alternate with windows of the same steps synchronised; the optimizer does not step in either, so the ranks'
models stay identical. A barrier starts every window, so a slow rank's backlog from an unsynchronised window is
not charged to the next synchronised one. Last, rank 0 alone trains a few steps of the bare module while the
others wait at a barrier: the one-process rate for the scaling efficiency.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from checks.verify.contract import DdpSpec
from checks.verify.smoke.loop import Batches, Trainer, train


def start(ddp: DdpSpec) -> None:
    """Join the process group through torchrun's store (``env://``: MASTER_ADDR/PORT, RANK, WORLD_SIZE); an
    absent peer fails after ``timeout_s``. The rank torchrun gave must be the one verify planned (the hosts' ranks
    summed in host order): a mismatch would file one rank's figures under another's GPU."""
    given = (int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1)))
    if given != (ddp.rank, ddp.world_size):
        raise RuntimeError(
            f"torchrun gave rank {given[0]} of {given[1]}, verify planned {ddp.rank} of {ddp.world_size}"
        )
    if ddp.backend == "gloo" and ddp.threads:
        torch.set_num_threads(ddp.threads)  # torchrun's OMP_NUM_THREADS: the ranks share the cores
    if ddp.backend == "nccl":
        torch.cuda.set_device(ddp.local_rank)  # the GPU index on this host
    dist.init_process_group(ddp.backend, init_method="env://", timeout=datetime.timedelta(seconds=ddp.timeout_s))


def stop() -> None:
    with contextlib.suppress(Exception):  # a peer already gone: nothing left to tear down cleanly
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel with its defaults (25 MiB buckets): what a user's first DDP run gets."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def grad_bytes(model: torch.nn.Module) -> int:
    """Bytes DDP all-reduces per step: every trainable parameter's gradient, in the parameter's dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _fwd_bwd(trainer: Trainer, feed: Batches, sync: bool) -> float:
    """One forward+backward from the batch fetch on (a straggler's slow data counts), without the optimizer."""
    begin = trainer.clock.mark()
    inputs, target = trainer.to_device(feed.next())
    model: Any = trainer.model
    with contextlib.nullcontext() if sync else model.no_sync():
        with trainer.autocast():
            loss = trainer.loss_fn(model(inputs), target)
        loss.backward()
    end = trainer.clock.mark()
    trainer.clock.finish()
    trainer.optimizer.zero_grad(set_to_none=True)
    return trainer.clock.seconds(begin, end)


def comm_ab(trainer: Trainer, feed: Batches, windows: int, steps: int) -> dict[str, Any]:
    """Alternate ``windows`` pairs of synchronised and ``no_sync`` windows (order swapped every pair, so a drift
    over the phase charges both alike); return every step's seconds, both medians and their difference."""
    sync_s: list[float] = []
    local_s: list[float] = []
    for w in range(windows):
        for sync in (True, False) if w % 2 == 0 else (False, True):
            barrier()
            for _ in range(steps):
                (sync_s if sync else local_s).append(_fwd_bwd(trainer, feed, sync))
    barrier()
    med_sync, med_local = statistics.median(sync_s), statistics.median(local_s)
    return {
        "windows": windows,
        "window_steps": steps,
        "sync_s": [round(x, 7) for x in sync_s],
        "no_sync_s": [round(x, 7) for x in local_s],
        "sync_median_s": med_sync,
        "no_sync_median_s": med_local,
        "exposed_s": med_sync - med_local,
        "grad_bytes": grad_bytes(trainer.model),
    }


def solo(trainer: Trainer, feed: Batches, steps: int) -> dict[str, Any] | None:
    """Rank 0 trains ``steps`` optimizer steps (after one warm-up) of the bare module while the others wait.

    Its model leaves the others' afterwards, so this runs last. Returns the median step on rank 0, else None.
    """
    result = None
    if rank() == 0:
        model: Any = trainer.model
        bare = dataclasses.replace(trainer, model=model.module)
        train(bare, feed, 1)
        records = train(bare, feed, steps)
        result = {"steps": steps, "median_s": statistics.median(r.total for r in records)}
    barrier()
    return result


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (pickled over the process group), in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def share(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def copy_file(saved: Any, directory: str | Path) -> Any:
    """Rank 0's saved checkpoint on every rank's own disk (across hosts): its bytes sent over the process group,
    written to ``directory`` here; rank 0 keeps its own. Returns the record with this rank's path."""
    data = share(Path(saved.path).read_bytes() if rank() == 0 else None)
    if rank() == 0:
        return saved
    path = Path(directory) / f"rank{rank()}-{Path(saved.path).name}"
    path.write_bytes(data)
    return dataclasses.replace(saved, path=str(path))
