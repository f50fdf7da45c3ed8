"""manifest.json: what a staged dataset is, written last; and ``--verify``, which re-checks a dataset against it.

Schema 1 (add fields freely; bump ``schema`` only for breaking changes)::

    {"schema": 1, "tool": "gpu-preflight 0.1.0", "created": "2026-11-29T16:00:00Z",
     "kind": "images" | "text", "format": "npy" | "pt", "fingerprint": "<sha256 of source identity + parameters>",
     "source": {"spec": "...", "layout": "imagefolder" | "list" | "text", "identity": "...", "files": 1000,
                "bytes": 123456, "ignored": {".txt": 2}},
     "parameters": {"size": 256, "resize": "crop", ...},
     "counts": {"inputs": 1000, "staged": 998, "rejected": 2, "tokens": 0},
     "classes": {"count": 10, "per_class": {"cat": 100, ...}},
     "outputs": {"images.npy": {"bytes": 1, "sha256": "...", "shape": [998, 256, 256, 3], "dtype": "uint8"}, ...},
     "rejects": [{"path": "cat/x.jpg", "reason": "corrupt or truncated: ..."}],
     "timings": {"fetch_s": 0.0, "scan_s": 0.1, "decode_s": 10.0, "finalize_s": 0.5, "total_s": 10.7},
     "resumed": {"items_done_before": 0}}
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from checks import TOOL_NAME, TOOL_VERSION
from datasets.finalize import fsync_dir, write_text
from datasets.transfer import file_sha256

SCHEMA = 1
NAME = "manifest.json"


def describe_outputs(out: Path, tick: Callable[[int], None]) -> dict[str, dict[str, Any]]:
    """Hash every output file in ``out`` and record its size (and, for arrays, shape and dtype)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(out.iterdir()):
        if path.name == NAME or path.name.startswith("."):
            continue
        entry: dict[str, Any] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        if path.suffix == ".npy":
            array = np.load(path, mmap_mode="r")
            entry.update(shape=list(array.shape), dtype=str(array.dtype))
        found[path.name] = entry
        tick(entry["bytes"])
    return found


def write(out: Path, doc: dict[str, Any]) -> None:
    """Write manifest.json into ``out`` last, and make it durable."""
    doc = {"schema": SCHEMA, "tool": f"{TOOL_NAME} {TOOL_VERSION}", "created": _now(), **doc}
    write_text(out / NAME, json.dumps(doc, indent=2) + "\n")
    fsync_dir(out)


def read(folder: Path) -> dict[str, Any] | None:
    """Return a staged dataset's manifest, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((folder / NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def looks_complete(folder: Path, doc: dict[str, Any]) -> bool:
    """Cheap check for the no-op path: every output file is there with its recorded size."""
    for name, entry in doc.get("outputs", {}).items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return False
    return True


def verify(folder: Path, tick: Callable[[int], None]) -> list[str]:
    """Re-hash every output and check array shapes against the manifest; return the problems found."""
    doc = read(folder)
    if doc is None:
        return [f"{folder / NAME} is missing or not a gpu-preflight manifest (schema {SCHEMA})"]
    problems = []
    for name, entry in sorted(doc.get("outputs", {}).items()):
        problems += _check_file(folder / name, entry, tick)
    problems += _check_counts(folder, doc)
    return problems


def _check_file(path: Path, entry: dict[str, Any], tick: Callable[[int], None]) -> list[str]:
    if not path.is_file():
        return [f"{path.name}: missing"]
    size = path.stat().st_size
    if size != entry["bytes"]:
        return [f"{path.name}: {size} bytes, manifest says {entry['bytes']}"]
    problems = []
    if file_sha256(path) != entry["sha256"]:
        problems.append(f"{path.name}: sha256 differs from the manifest (the file changed or is damaged)")
    tick(size)
    if path.suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r")
        except ValueError as exc:
            return [*problems, f"{path.name}: not a readable .npy ({exc})"]
        if list(array.shape) != entry.get("shape") or str(array.dtype) != entry.get("dtype"):
            problems.append(
                f"{path.name}: shape {list(array.shape)} {array.dtype}, manifest says "
                f"{entry.get('shape')} {entry.get('dtype')}"
            )
    return problems


def _check_counts(folder: Path, doc: dict[str, Any]) -> list[str]:
    """Cross-check the arrays with each other: one label per image, offsets ending at the token count."""
    outputs, staged = doc.get("outputs", {}), doc.get("counts", {}).get("staged")
    problems = []
    for name in ("images.npy", "labels.npy"):
        if name in outputs and outputs[name].get("shape", [None])[0] != staged:
            problems.append(f"{name}: {outputs[name].get('shape', [None])[0]} rows, manifest counts {staged} staged")
    if "doc_offsets.npy" in outputs and (folder / "doc_offsets.npy").is_file():
        offsets = np.load(folder / "doc_offsets.npy")
        tokens = doc.get("counts", {}).get("tokens")
        if len(offsets) and (int(offsets[-1]) != tokens or bool(np.any(np.diff(offsets) < 0))):
            problems.append("doc_offsets.npy: offsets are not increasing up to the token count")
    return problems


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
