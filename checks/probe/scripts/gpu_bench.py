"""Child process: GPU micro-benchmarks, one JSON line out. Run by checks/probe/torch.py; imports no project code.

argv[1] is a JSON object: copy_mib, d2d_mib, matmul_n, warmup, repeats, and "device" ("cuda", or "cpu" so the
timing code itself can be exercised without a GPU). Each figure is the median of ``repeats`` timings taken
after ``warmup`` runs; on CUDA the timings are CUDA events (docs/sources.md#benchmark-method: median over samples,
warm up first).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MIB = 1024**2  # checks.units.MIB: a standalone child script, it does not import the checkout
Timer = Callable[[Callable[[], object]], float]


def _timer(torch: Any, device: str) -> Timer:
    """Return a function that times one call in seconds (CUDA events on a GPU)."""
    if device.startswith("cuda"):

        def time_cuda(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0

        return time_cuda

    def time_cpu(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return time_cpu


def _median(timer: Timer, fn: Callable[[], object], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        timer(fn)
    return statistics.median(timer(fn) for _ in range(repeats))


def _dtype(torch: Any, device: str) -> Any:
    if not device.startswith("cuda"):
        return torch.float32
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 8:
        return torch.bfloat16
    return torch.float16 if major >= 7 else torch.float32


def _copy_rates(torch: Any, device: str, nbytes: int, timer: Timer, w: int, r: int) -> tuple[float, float]:
    """Host<->device GB/s with pinned host memory (pageable memory would measure the staging copy)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = _median(timer, lambda: dev.copy_(host, non_blocking=True), w, r)
    d2h = _median(timer, lambda: host.copy_(dev, non_blocking=True), w, r)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def _d2d_rate(torch: Any, device: str, nbytes: int, timer: Timer, w: int, r: int) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2 * nbytes / _median(timer, lambda: b.copy_(a), w, r) / 1e9  # a copy reads and writes every byte


def _matmul_rate(torch: Any, device: str, n: int, timer: Timer, w: int, r: int) -> tuple[float, str]:
    dtype = _dtype(torch, device)
    x = torch.randn(n, n, device=device, dtype=dtype)
    y = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _median(timer, lambda: torch.matmul(x, y), w, r)
    return 2 * n**3 / seconds / 1e12, str(dtype).replace("torch.", "")


def bench_device(torch: Any, device: str, s: dict[str, Any]) -> dict[str, Any]:
    timer, w, r = _timer(torch, device), int(s["warmup"]), int(s["repeats"])
    h2d, d2h = _copy_rates(torch, device, int(s["copy_mib"]) * MIB, timer, w, r)
    d2d = _d2d_rate(torch, device, int(s["d2d_mib"]) * MIB, timer, w, r)
    tflops, dtype = _matmul_rate(torch, device, int(s["matmul_n"]), timer, w, r)
    return {"h2d_gb_s": h2d, "d2h_gb_s": d2h, "d2d_gb_s": d2d, "matmul_tflops": tflops, "matmul_dtype": dtype}


def device_uuid(torch: Any, index: int) -> str | None:
    """The device UUID (torch >= 2.1): CUDA's index order is not NVML's unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so
    the UUID joins CUDA's index to NVML's (p2p_bench.py uses it too)."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except Exception:  # noqa: BLE001
        return None
    return str(uuid) if uuid is not None else None


def main(settings: dict[str, Any]) -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return {"skipped": f"torch cannot be imported: {exc}"}
    if settings.get("device", "cuda") == "cpu":
        return {"gpus": [{"index": 0, **bench_device(torch, "cpu", settings)}]}
    if not torch.cuda.is_available():
        return {"skipped": "CUDA is not available to torch (see cuda-compat)"}
    rows = []
    for i in range(torch.cuda.device_count()):
        row: dict[str, Any] = {"index": i, "uuid": device_uuid(torch, i)}
        try:
            torch.cuda.set_device(i)
            row.update(bench_device(torch, f"cuda:{i}", settings))
        except Exception as exc:  # noqa: BLE001 - one failing GPU is a row, not an abort
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            torch.cuda.empty_cache()
        rows.append(row)
    return {"gpus": rows}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
    sys.stdout.flush()
