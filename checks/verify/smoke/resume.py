"""The checkpoint round trip as a phase of verify's child (torch): save at the end of the measured steps, train
on, reload into a fresh model and optimizer, replay the same batches, compare; then compare the batches the
reloaded loader yields with the kept ones (the data resume, judged on its own). The primitives (the atomic save,
the RNG states, recording and replaying batches, the comparisons) are ``checks/verify/smoke/ckpt.py``'s.

Under several processes rank 0 saves every rank's RNG state and each rank restores its own; across hosts each
rank loads its own copy of rank 0's file (another host cannot read rank 0's disk).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from checks.verify.contract import CheckpointSpec, DdpSpec
from checks.verify.smoke import ddp
from checks.verify.smoke.ckpt import (
    Recording,
    Replay,
    compare,
    deterministic,
    load,
    rng_state,
    same_batches,
    save_atomic,
    set_rng_state,
)
from checks.verify.smoke.loop import train
from checks.verify.smoke.setup import Build


def round_trip(b: Build, spec: CheckpointSpec, dist: DdpSpec | None, result: dict[str, Any]) -> dict[str, Any]:
    """Save what a resume needs after the steps in ``result`` (warm-up and measured), resume, and compare: the
    save and load costs, the loss verdict and the data verdict. ``b`` goes on from the resumed state."""
    last = result["steps"][-1]["loss"] if result["steps"] else None
    payload = {
        "format": 1,
        "model": b.trainer.model.state_dict(),
        "optimizer": b.trainer.optimizer.state_dict(),
        "scaler": b.trainer.scaler.state_dict() if b.trainer.scaler is not None else None,
        "step": len(result["warmup"]) + len(result["steps"]),
        "epoch": b.feed.epoch,
        "loss": last,
        "rng": rng_state(),
        "sampler": b.feed.position(),
    }
    if b.cuda:
        torch.cuda.synchronize()
    if dist is not None:  # rank 0 saves every rank's RNG state; each rank restores its own
        payload["rng_per_rank"] = ddp.gather(payload["rng"])
    saved = save_atomic(payload, Path(spec.dir)) if ddp.rank() == 0 else None
    saved = ddp.share(saved) if dist is not None else saved
    assert saved is not None
    copied = dist is not None and dist.nodes > 1  # other hosts cannot read rank 0's disk
    saved = ddp.copy_file(saved, Path(spec.dir)) if copied else saved
    del payload
    with deterministic():
        recording = Recording(b.feed)
        on = [r.loss for r in train(b.trainer, recording, spec.resume_steps)]
        b.feed.close()
        try:
            restored, load_s = load(saved.path, b.device)
            fresh = b.fresh_trainer(restored)
            set_rng_state(restored["rng_per_rank"][ddp.rank()] if "rng_per_rank" in restored else restored["rng"])
            pos = restored["sampler"]
            feed = b.feed_factory(b.batch_size, epoch=pos["epoch"], start=pos["batch"])
        except Exception:
            # The phases after this one (compile A/B, DDP legs) train on: give them an open feed, or their
            # failure would read "feed closed" (seen on a GPU when set_rng_state raised here).
            b.feed = b.feed_factory(b.batch_size)
            raise
        replay = Replay(feed, recording.kept)
        again = [r.loss for r in train(fresh, replay, spec.resume_steps)]
    b.trainer, b.feed = fresh, feed  # later phases go on from the resumed state (one model in memory)
    ddp.barrier()  # every rank has loaded it
    if ddp.rank() == 0 or copied:  # rank 0's file, or this rank's own copy
        os.unlink(saved.path)
    verdict = compare(on, again, spec.rtol)
    data = same_batches(recording.kept, replay.drawn, (recording.indices, replay.indices))
    data["workers"] = int(b.loader.get("num_workers") or 0)
    cost = {"save_s": saved.seconds, "bytes": saved.bytes, "dir": spec.dir, "load_s": load_s}
    return cost | verdict | {"data": data}
