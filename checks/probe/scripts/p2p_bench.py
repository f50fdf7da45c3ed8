"""Child process: device-to-device copy bandwidth for every ordered GPU pair, one JSON line out. Imports no project
code but its sibling script gpu_bench.py (the UUID rule); run by checks/probe/collective.py (``run_p2p``).

argv[1] is a JSON object: mib (copy size), warmup, repeats, and "device" ("cuda", or "cpu" so the timing loop runs
without a GPU: two host buffers stand in for two GPUs). Like nvbandwidth's device_to_device_memcpy_write_ce
(docs/sources.md#nvbandwidth): one pair at a time, a copy-engine copy (``Tensor.copy_``) timed with
CUDA events on the source GPU's stream after warm-up, the median of the repeats. Peer access is whatever CUDA
grants (``can_device_access_peer``); without it the driver stages the copy through host memory and the row says so.
Output: ``{"pairs": [{"src", "dst", "gb_s", "peer_access", "error"}], "uuids": [...], "mib"}`` or ``{"skipped"}``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from typing import Any

# The sibling script (this folder is sys.path[0] when Python runs a script from it): one UUID rule for both.
from gpu_bench import device_uuid

MIB = 1024**2  # checks.units.MIB: a standalone child script, it does not import the checkout


def _time_copy(torch: Any, dst: Any, src: Any, cuda: bool) -> float:
    """Seconds of one ``dst.copy_(src)``: CUDA events on the current (source) stream, or the wall clock."""
    if not cuda:
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


def measure_pair(torch: Any, src: str, dst: str, nbytes: int, warmup: int, repeats: int) -> float:
    """GB/s (1e9) of copying ``nbytes`` from device ``src`` to device ``dst``: the median of ``repeats``."""
    cuda = src.startswith("cuda")
    a = torch.ones(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    with torch.cuda.device(src) if cuda else contextlib.nullcontext():
        for _ in range(warmup):
            _time_copy(torch, b, a, cuda)
        seconds = statistics.median(_time_copy(torch, b, a, cuda) for _ in range(repeats))
    return nbytes / seconds / 1e9


def _row(torch: Any, i: int, j: int, settings: dict[str, Any], cuda: bool) -> dict[str, Any]:
    nbytes, w, r = int(settings["mib"]) * MIB, int(settings["warmup"]), int(settings["repeats"])
    row: dict[str, Any] = {"src": i, "dst": j}
    try:
        row["peer_access"] = bool(torch.cuda.can_device_access_peer(i, j)) if cuda else None
        src, dst = (f"cuda:{i}", f"cuda:{j}") if cuda else ("cpu", "cpu")
        row["gb_s"] = round(measure_pair(torch, src, dst, nbytes, w, r), 3)
    except Exception as exc:  # noqa: BLE001 - one failing pair is a row, not an abort
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        if cuda:
            torch.cuda.empty_cache()
    return row


def main(settings: dict[str, Any]) -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return {"skipped": f"torch cannot be imported: {exc}"}
    cuda = settings.get("device", "cuda") != "cpu"
    if cuda and not torch.cuda.is_available():
        return {"skipped": "CUDA is not available to torch (see cuda-compat)"}
    count = torch.cuda.device_count() if cuda else int(settings.get("cpu_devices", 2))
    if count < 2:
        return {"skipped": f"{count} GPU visible to torch: no pair to measure"}
    uuids = [device_uuid(torch, i) for i in range(count)] if cuda else []
    pairs = [_row(torch, i, j, settings, cuda) for i in range(count) for j in range(count) if i != j]
    return {"pairs": pairs, "uuids": uuids, "mib": int(settings["mib"])}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
    sys.stdout.flush()
