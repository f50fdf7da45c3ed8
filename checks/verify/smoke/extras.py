"""Measurements around the main loop (child process, torch): FLOPs, kernel statistics, memory, out-of-memory
handling, the batch-size sweep and the torch.compile A/B. The DataLoader alone: ``checks.verify.smoke.candidates``.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import typing
from collections.abc import Callable
from typing import Any

import torch

from checks.verify.figures import knee_batch, union_length
from checks.verify.smoke.loop import Feed, Trainer, train

SHORT_KERNEL_NS = 10_000  # HTA's "short kernels": launches cost 5-20 µs on the host (docs/sources.md#hta)


def oom_error(exc: BaseException) -> bool:
    """True for torch's out-of-memory errors (``torch.OutOfMemoryError``, or the bare RuntimeError of old builds)."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def release(cuda: bool) -> None:
    """Give freed memory back after an OOM so the next attempt starts clean."""
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def memory(cuda: bool) -> dict[str, Any] | None:
    """Caching-allocator figures (docs/sources.md#cuda-memory-stats); None on the CPU."""
    if not cuda:
        return None
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {
        "total_bytes": total,
        "free_bytes": free,
        "allocated_bytes": torch.cuda.memory_allocated(),
        "reserved_bytes": torch.cuda.memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "inactive_split_bytes": stats.get("inactive_split_bytes.all.current", 0),
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
        "num_device_alloc": stats.get("num_device_alloc"),
    }


def count_flops(trainer: Trainer, batch: Any) -> tuple[int | None, str | None]:
    """FLOPs of one optimizer step (forward + backward, x accumulation), counted by FlopCounterMode."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        inputs, target = trainer.to_device(batch)
        with FlopCounterMode(display=False) as counter:
            with trainer.autocast():
                loss = trainer.loss_fn(trainer.model(inputs), target)
            loss.backward()
        trainer.optimizer.zero_grad(set_to_none=True)
        return int(counter.get_total_flops()) * trainer.accum, None
    except Exception as exc:  # noqa: BLE001 - a model the counter cannot trace costs MFU, not the run
        trainer.optimizer.zero_grad(set_to_none=True)
        return None, f"FLOP counting failed: {type(exc).__name__}: {exc}"


def kernel_stats(trainer: Trainer, feed: Feed, steps: int) -> dict[str, Any]:
    """Profile ``steps`` steps (CUDA activity only, no shapes/stacks/memory): kernel count, durations, busy share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        records = train(trainer, feed, steps)
    kernels = [
        (e.start_ns(), e.end_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == DeviceType.CUDA and not e.name().startswith(("Memcpy", "Memset"))
    ]
    return kernel_summary(kernels, sum(r.forward + r.backward + r.optimizer for r in records), steps)


def kernel_summary(kernels: list[tuple[int, int]], compute_s: float, steps: int) -> dict[str, Any]:
    """Kernels per step, median duration, short-kernel share, and busy time / compute window (Kineto's GPU util)."""
    if not kernels:  # CUPTI unavailable (containers without the profiling capability): abstain, never "0% busy"
        return {"steps": steps, "kernels_per_step": 0.0, "median_kernel_us": None, "busy_fraction": None,
                "short_kernel_time_share": None, "note": "the profiler recorded no kernels"}  # fmt: skip
    durations = sorted(b - a for a, b in kernels)
    busy_s = union_length(kernels) / 1e9
    short = sum(d for d in durations if d < SHORT_KERNEL_NS)
    return {
        "steps": steps,
        "kernels_per_step": len(durations) / max(1, steps),
        "median_kernel_us": statistics.median(durations) / 1e3 if durations else None,
        "short_kernel_time_share": short / sum(durations) if durations else None,
        "busy_fraction": min(1.0, busy_s / compute_s) if compute_s > 0 else None,
    }


def _throughput(trainer: Trainer, feed: Feed, warmup: int, steps: int) -> dict[str, Any]:
    train(trainer, feed, warmup)
    records = train(trainer, feed, steps)
    median = statistics.median(r.total for r in records)
    samples = feed.batches.batch_size * trainer.accum
    return {"median_step_s": median, "samples_per_s": samples / median if median > 0 else None}


def sweep(
    make: Callable[[int], tuple[Trainer, Feed]],
    start: int,
    limit: int,
    warmup: int,
    steps: int,
    knee: float,
    deadline: float = 0.0,
) -> dict[str, Any]:
    """Double the batch from ``start`` until OOM, ``limit``, or a doubling that gains less than 1/knee - 1; with a
    ``deadline`` (monotonic seconds), also before a batch that would not end by then (``cut_at``: that batch;
    ``cut_needs_s``: its estimate, twice the last batch's time)."""
    rows: list[dict[str, Any]] = []
    batch, cuda = start, torch.cuda.is_available()
    last_s = 0.0
    while batch <= limit:
        if deadline and rows and time.monotonic() + 2 * last_s > deadline:
            return {"rows": rows, "knee_batch": knee_batch(rows, knee), "cut_at": batch, "cut_needs_s": 2 * last_s}
        began = time.monotonic()
        try:
            trainer, feed = make(batch)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            row = {"batch": batch, **_throughput(trainer, feed, warmup, steps)}
            row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved() if cuda else None
            feed.close()
        except Exception as exc:
            if not oom_error(exc):
                raise
            rows.append({"batch": batch, "oom": True})
            release(cuda)
            break
        rows.append(row)
        last_s = time.monotonic() - began
        if len(rows) > 1 and row["samples_per_s"] < rows[-2]["samples_per_s"] / knee:
            break
        batch *= 2
    return {"rows": rows, "knee_batch": knee_batch(rows, knee)}


def compile_ab(trainer: Trainer, feed: Feed, steps: int) -> dict[str, Any]:
    """Time ``steps`` steps of the torch.compile'd model (reduce-overhead: CUDA graphs on a GPU)."""
    cuda = trainer.device.type == "cuda"
    mode = "reduce-overhead" if cuda else "default"
    compiled = dataclasses.replace(trainer, model=typing.cast(torch.nn.Module, torch.compile(trainer.model, mode=mode)))
    start = time.monotonic()
    try:
        train(compiled, feed, 3)
        warm_s = time.monotonic() - start
        records = train(compiled, feed, steps)
    except Exception as exc:  # noqa: BLE001 - "some models might not compile" (tuning guide): report, go on
        return {"mode": mode, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    return {
        "mode": mode,
        "compile_s": round(warm_s, 2),
        "steps": steps,
        "median_step_s": statistics.median(r.total for r in records),
        "median_compute_s": statistics.median(r.forward + r.backward + r.optimizer for r in records),
    }
