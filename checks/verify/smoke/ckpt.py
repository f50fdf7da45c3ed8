"""Checkpoint round trip (child process, torch): save everything a resume needs, time it, reload, compare.

What is saved is what the seed article §4.4 says a resume needs, plus what it warns is forgotten: model,
optimizer, scaler, epoch/step, loss, the RNG states of python/numpy/torch/CUDA, and the sampler position. The file
is written to a temporary name, fsynced, renamed over the final name and the directory fsynced, so a crash never
leaves a torn checkpoint under the real name. It loads with ``weights_only=True``: the RNG states are stored as
plain tuples, lists and tensors for that.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_NAME = "gpu-preflight-verify.pt"
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP wrappers, torch.compile's wrapper


def rng_state() -> dict[str, Any]:
    """Capture python, numpy, torch and (when present) every CUDA device's RNG state."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos)},
        "numpy_gauss": (int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    random.setstate(state["python"])
    n = state["numpy"]
    has_gauss, cached = state["numpy_gauss"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop ``module.`` (DDP/DataParallel) and ``_orig_mod.`` (torch.compile) from the keys (seed article §4.4)."""
    out = {}
    for key, value in state_dict.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


@dataclass(frozen=True)
class SaveStats:
    path: str
    bytes: int
    seconds: float  # serialise + write + fsync + rename + directory fsync


def save_atomic(payload: dict[str, Any], directory: Path) -> SaveStats:
    """Write ``payload`` to ``directory`` atomically and durably; time the whole of it."""
    final = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    start = time.perf_counter()
    try:
        with tmp.open("wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return SaveStats(str(final), final.stat().st_size, time.perf_counter() - start)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (a directory fsync; some filesystems refuse it, which changes nothing here)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str, device: torch.device) -> tuple[dict[str, Any], float]:
    """Load a checkpoint with ``weights_only=True``; return it and the seconds it took."""
    start = time.perf_counter()
    payload = torch.load(path, map_location=device, weights_only=True)
    return payload, time.perf_counter() - start


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic kernels for both legs of the comparison (cuDNN picks atomics-based ones otherwise)."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    bench = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[1], bench


def compare(uninterrupted: list[float], resumed: list[float], rtol: float) -> dict[str, Any]:
    """Judge the losses of the steps after the checkpoint: equal (within ``rtol``; 0 means bit for bit)."""
    diffs = [abs(a - b) for a, b in zip(uninterrupted, resumed, strict=True)]
    worst = max((d / max(abs(a), 1e-12) for d, a in zip(diffs, uninterrupted, strict=True)), default=0.0)
    same = all(a == b for a, b in zip(uninterrupted, resumed, strict=True)) or (rtol > 0 and worst <= rtol)
    return {
        "reproduced": bool(same and len(uninterrupted) == len(resumed) and uninterrupted),
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "max_rel_diff": worst,
    }
