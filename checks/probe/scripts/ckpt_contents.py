"""What a checkpoint file holds, as a resume needs it: model, optimizer, the position (epoch, step), the loss, the
RNG state and the data position (the seed's list of what a checkpoint keeps, docs/sources.md#seed-article §4.4).

Usage: python ckpt_contents.py PATH [PATH ...]. Read with ``torch.load(weights_only=True)``, the default load since torch 2.6
(docs/sources.md#torch-load-weights-only; memory-mapped where the file allows it, so a large file is not read
whole); prints one JSON object: the load's
time and the parts found, or ``{"error": ...}`` when torch's default load refuses the file. Nothing of the user's
code runs (no unpickling of their classes).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

POSITION = ("epoch", "step", "iter", "global_step", "batch")
RNG = ("rng", "random", "generator", "seed")
DATA = ("sampler", "loader", "data", "position")  # "position": where in the epoch (templates/train.py)


def kind(value: Any, torch: Any) -> str:
    """``state_dict`` (names to tensors), ``optimizer``, ``scheduler``, ``scaler``, ``tensor``, ``number``, or
    ``other``."""
    if isinstance(value, dict):
        if {"state", "param_groups"} <= set(value):
            return "optimizer"
        if "last_epoch" in value or "_step_count" in value:
            return "scheduler"
        if {"scale", "growth_factor"} <= set(value):
            return "scaler"
        if value and all(isinstance(v, torch.Tensor) for v in value.values()):
            return "state_dict"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return "other"


def describe(obj: Any, torch: Any) -> dict[str, Any]:
    """The parts a resume needs, found by what each top-level entry is and what its key says."""
    if kind(obj, torch) == "state_dict":  # a bare model state_dict: nothing else is in the file
        return {"keys": [], "model": _model(["(the whole file)"], [obj])}
    if not isinstance(obj, dict):
        return {"keys": [], "top": type(obj).__name__}
    out: dict[str, Any] = {"keys": [str(k) for k in obj]}
    models = [(str(k), v) for k, v in obj.items() if kind(v, torch) == "state_dict" and not _named(k, RNG + DATA)]
    if models:
        out["model"] = _model([k for k, _ in models], [v for _, v in models])
    for k, v in obj.items():
        name, what = str(k), kind(v, torch)
        if what == "optimizer":
            state, groups = v.get("state") or {}, v.get("param_groups") or []
            out["optimizer"] = {
                "key": name,
                "params": sum(len(g.get("params", [])) for g in groups),
                "with_state": len(state),
            }
        elif what in ("scheduler", "scaler"):
            out[what] = name
        elif _named(k, RNG):
            out.setdefault("rng", []).append(name)
        elif _named(k, DATA):
            out.setdefault("data", []).append(name)
        elif _named(k, POSITION) and what in ("number", "tensor"):
            out.setdefault("position", {})[name] = _number(v, torch)
        elif "loss" in name.lower() and what in ("number", "tensor"):
            out["loss"] = {"key": name, "value": _number(v, torch)}
    return out


def _named(key: Any, words: tuple[str, ...]) -> bool:
    return any(w in str(key).lower() for w in words)


def _model(keys: list[str], dicts: list[dict[str, Any]]) -> dict[str, Any]:
    tensors = [t for d in dicts for t in d.values()]
    return {"keys": keys, "tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors)}


def _number(value: Any, torch: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    return float(value)


def main(path: str) -> dict[str, Any]:
    import torch

    began = time.monotonic()
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # the old (non-zip) format cannot be mapped: read it whole
            if "mmap" not in str(exc):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - what the user's resume would meet, reported
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
        telling = next((line for line in lines if "Unsupported global" in line), lines[0])  # what it refused
        return {"error": f"{type(exc).__name__}: {telling}"[:400]}
    return {"load_s": round(time.monotonic() - began, 4), **describe(obj, torch)}


if __name__ == "__main__":  # one file: its contents; several: {"files": [each file's]}, read by one import torch
    paths = sys.argv[1:]
    print(json.dumps(main(paths[0]) if len(paths) == 1 else {"files": [main(path) for path in paths]}))
