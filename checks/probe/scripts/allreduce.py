"""Worker: all-reduce bandwidth across hosts, one process per GPU (NCCL) or per host (gloo). Imports no project code.

Launched by torchrun (``python -m torch.distributed.run``) on every host; rank 0 prints one JSON line:
``{"backend", "world_size", "rows": [{"backend", "world_size", "bytes", "algbw_gb_s", "busbw_gb_s", "seconds",
"iterations"}]}`` or ``{"error": ...}``. Sizes go 1 MiB, 4 MiB, ... up to ``--max-mib``, stopping before a size
whose predicted time would overrun ``--budget-s``; the decision is rank 0's, broadcast so all ranks agree.
busbw = algbw x 2(n-1)/n (nccl-tests' definition for all-reduce, docs/sources.md#nccl-busbw).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

MIB = 1024**2  # checks.units.MIB: a standalone child script, it does not import the checkout


def _route_interface(master: str) -> str | None:
    """The interface that reaches the master: gloo and NCCL pick theirs from the hostname otherwise."""
    try:
        import psutil

        with socket.socket(socket.AF_INET6 if ":" in master else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))
            local = s.getsockname()[0]
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == local for a in addrs):
                return str(name)
    except (ImportError, OSError):
        return None
    return None


def _sync(torch: Any, backend: str) -> None:
    if backend == "nccl":
        torch.cuda.synchronize()


def _time_size(torch: Any, dist: Any, nbytes: int, backend: str, device: Any) -> tuple[float, int]:
    """Median seconds of one all-reduce of ``nbytes`` (float32), after one warm-up; and the iteration count."""
    data = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    start = time.perf_counter()
    dist.all_reduce(data)
    _sync(torch, backend)
    warm = time.perf_counter() - start
    agreed = torch.tensor([max(2, min(20, int(0.5 / max(warm, 1e-6))))], device=device)
    dist.broadcast(agreed, 0)
    times = []
    for _ in range(int(agreed.item())):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(data)
        _sync(torch, backend)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(times)


def _go_on(torch: Any, dist: Any, keep_going: bool, device: Any) -> bool:
    flag = torch.tensor([1 if keep_going else 0], device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def sweep(torch: Any, dist: Any, args: argparse.Namespace, device: Any) -> list[dict[str, Any]]:
    world, rows, spent, size = dist.get_world_size(), [], 0.0, MIB
    while size <= args.max_mib * MIB:
        seconds, iterations = _time_size(torch, dist, size, args.backend, device)
        spent += seconds * (iterations + 1)
        algbw = size / seconds / 1e9
        rows.append(
            {
                "backend": args.backend,
                "world_size": world,
                "bytes": size,
                "algbw_gb_s": round(algbw, 4),
                "busbw_gb_s": round(algbw * 2 * (world - 1) / world, 4),
                "seconds": round(seconds, 6),
                "iterations": iterations,
            }
        )
        predicted = spent + 4 * seconds * (iterations + 1)
        if not _go_on(torch, dist, predicted <= args.budget_s, device):
            break
        size *= 4
    return rows


def use_route_interface(master: str) -> None:
    """Point gloo and NCCL at the interface that reaches the master, unless the user chose one."""
    iface = _route_interface(master)
    if iface:  # the user's own choice wins
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)


def sweep_in_group(torch: Any, dist: Any, args: argparse.Namespace, local: int, init: Any) -> list[dict[str, Any]]:
    """``init()`` joins the process group; then the sweep on this rank's device (its GPU for NCCL, else the CPU),
    and the group is left whatever happened. Also what bootstrap's job run (job_gather.py) calls."""
    device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(device)
    init()
    try:
        return sweep(torch, dist, args, device)
    finally:
        dist.destroy_process_group()


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="gloo")
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    args = parser.parse_args()
    use_route_interface(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    import torch
    import torch.distributed as dist

    def init() -> None:
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout_s))

    rows = sweep_in_group(torch, dist, args, int(os.environ.get("LOCAL_RANK", "0")), init)
    world = rows[0]["world_size"] if rows else 0
    return {"backend": args.backend, "world_size": world, "rows": rows, "rank": int(os.environ.get("RANK", "0"))}


if __name__ == "__main__":
    result = main()
    if result.pop("rank") == 0:
        print(json.dumps(result), flush=True)
    sys.exit(0)
