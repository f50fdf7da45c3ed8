"""The checkpoint a command wrote, read back as its resume would read it: what it holds against the seed's list
(model, optimizer, epoch, loss, RNG and sampler state: docs/sources.md#seed-article §4.4), without running any of
the user's resume code.

The agent says each ``torch.save`` to a file (a ``saved`` line with its path); verify reads the last one rank 0
(or the only process) wrote, after the run, with ``torch.load(weights_only=True)`` in a child
(``checks/probe/scripts/ckpt_contents.py``): the load torch 2.6+ does by default, so a file it refuses is a resume
that fails with the default (docs/sources.md#torch-load-weights-only).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from checks.result import Result, ok, skip, warn
from checks.verify.events import Event, Moved, Saved

NEEDED = ("model", "optimizer", "position")  # a resume without any of these restarts training, not resumes it
WORDS = {
    "model": "model weights",
    "optimizer": "optimizer state (a resume would restart Adam's moments and the step count)",
    "position": "epoch/step (a resume would start the schedule and the data over)",
    "loss": "loss",
    "rng": "RNG state (a resumed run draws other random numbers: dropout, augmentation)",
    "data": "sampler/data position (a resumed epoch repeats or skips samples)",
}


def last_saved(events: Sequence[Event], pids: Sequence[int]) -> str | None:
    """The last file ``pids`` (rank 0's process, or the only one) saved with torch.save that still exists, under
    the name it was renamed to (a save to a temporary name, then ``os.replace``)."""
    paths: list[str] = []
    for e in events:
        if not isinstance(e, (Saved, Moved)) or e.pid not in pids or not e.path:
            continue
        if isinstance(e, Saved):
            paths.append(e.path)
        elif e.path in paths:  # saved under a temporary name, then renamed
            paths[paths.index(e.path)] = e.to
    return next((p for p in reversed(paths) if os.path.isfile(p)), None)


def missing(contents: dict[str, Any]) -> list[str]:
    """The parts of the seed's list the file does not hold, in its order."""
    return [part for part in WORDS if not contents.get(part)]


def contents_result(path: str | None, contents: dict[str, Any] | None) -> Result:
    """``verify-checkpoint`` of a command: whether the file it saved holds what a resume needs."""
    if path is None or contents is None:
        return skip("verify-checkpoint", "the command saved no checkpoint to a file with torch.save while verify ran")
    if "error" in contents:
        hint = (
            "save tensors, numbers, strings and dicts/lists of them (numbers as float(x), not numpy scalars), or "
            "allow the class with torch.serialization.add_safe_globals; weights_only=False only for files you trust"
        )
        summary = f"torch.load's default (weights_only=True, torch 2.6+) cannot read {path}: {contents['error']}"
        return warn("verify-checkpoint", summary, hint, value="unreadable")
    gone = missing(contents)
    held = [part for part in WORDS if part not in gone]
    summary = f"{path} holds: {', '.join(held) or 'none of the parts a resume needs'}"
    optimizer = contents.get("optimizer") or {}
    if optimizer and optimizer.get("with_state", 0) < optimizer.get("params", 0):
        summary += f" (optimizer state for {optimizer['with_state']} of {optimizer['params']} parameters)"
    if any(part in gone for part in NEEDED):
        hint = "a resume needs " + "; ".join(WORDS[p] for p in gone) + ": save them in the same file"
        return warn("verify-checkpoint", summary + "; missing " + ", ".join(gone), hint, value="incomplete")
    if gone:
        summary += "; not saved: " + "; ".join(WORDS[p] for p in gone)
    return ok("verify-checkpoint", summary + f" (read back in {contents.get('load_s', 0):.2f} s)", value="complete")
