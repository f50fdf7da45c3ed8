"""A background thread that samples NVML and psutil ~10 times a second, and what the samples say.

The sampler runs in the gpu-preflight process while the training runs in another one (verify's child, or the
user's own job for watch), so it adds no GIL contention to the loop it measures (docs/sources.md#sampler-process). Each
row is stamped with ``time.monotonic()``, which is system-wide on Linux, so rows join the child's step windows.
A row's CPU figures average the time since the previous row; NVML's utilisation covers its own 1/6-1 s period
(docs/sources.md#nvml-utilization), so values finer than that are interpolation.

CSV format (one row per sample; empty cell: not answered): ``t_mono`` (monotonic seconds), ``t_s`` (seconds since
the first sample), ``cpu_pct`` (mean over usable cores), ``cpu_max_core_pct``, ``iowait_pct``, ``core<i>_pct``,
``tree_cpu_cores`` / ``worker_cpu_cores`` / ``workers`` (the watched process tree), and per GPU
``gpu<i>_util_pct``, ``_mem_util_pct``, ``_mem_used_mib``, ``_mem_total_mib``, ``_power_w``, ``_sm_mhz``,
``_sm_max_mhz``, ``_clock_reasons`` (bit mask), ``_pcie_tx_mb_s``, ``_pcie_rx_mb_s``.
"""

from __future__ import annotations

import csv
import io
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.fileio import write_atomic
from checks.probe.sample import GpuReader, HostReader

Row = dict[str, float | None]
Window = tuple[float, float]


@dataclass
class Trace:
    """Samples in time order; ``cpu_s`` is the sampler thread's own CPU time (its overhead)."""

    rows: list[Row] = field(default_factory=list)
    interval_s: float = 0.1
    cpu_s: float = 0.0

    @property
    def columns(self) -> list[str]:
        seen: dict[str, None] = {"t_mono": None, "t_s": None}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)

    def values(self, column: str) -> list[float]:
        """Return the answered values of ``column``."""
        return [v for row in self.rows if (v := row.get(column)) is not None]

    def gpus(self) -> list[int]:
        """Return the GPU indices that have columns."""
        found = {int(c[3:].split("_", 1)[0]) for c in self.columns if c.startswith("gpu") and c.endswith("_util_pct")}
        return sorted(found)

    def within(self, start: float, end: float) -> Trace:
        """Return the rows stamped between ``start`` and ``end`` (monotonic seconds)."""
        rows = [r for r in self.rows if start <= (r.get("t_mono") or 0.0) <= end]
        return Trace(rows, self.interval_s, self.cpu_s)

    def write_csv(self, path: Path) -> None:
        """Write the rows as CSV, atomically."""
        t0 = self.rows[0]["t_mono"] if self.rows else 0.0
        cols = self.columns
        text = io.StringIO()
        out = csv.writer(text, lineterminator="\n")
        out.writerow(cols)
        for row in self.rows:
            full = {**row, "t_s": round((row.get("t_mono") or 0.0) - (t0 or 0.0), 3)}
            out.writerow(["" if full.get(c) is None else _cell(full[c]) for c in cols])
        write_atomic(path, text.getvalue())


def _cell(value: float | None) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def read_csv(path: Path, interval_s: float = 0.1) -> Trace:
    """Read a trace written by ``Trace.write_csv`` (or a hand-written one with the same columns)."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [{k: (float(v) if v != "" else None) for k, v in row.items()} for row in csv.DictReader(fh)]
    return Trace(rows, interval_s)


class Sampler:
    """Context manager: a daemon thread reads ``readers`` every ``interval_s`` until the block ends."""

    def __init__(self, interval_s: float, gpu: GpuReader, host: HostReader) -> None:
        self.interval_s = interval_s
        self.gpu, self.host = gpu, host
        self.trace = Trace(interval_s=interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-preflight-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.gpu.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Trace:
        """Stop the thread (idempotent) and return the trace."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.gpu.__exit__()
        return self.trace

    def focus(self, uuid: str | None) -> None:
        """Read PCIe throughput only for the GPU with ``uuid`` (each read costs 2 x 20 ms of NVML time)."""
        index = self.gpu.index_of(uuid)
        if index is not None:
            self.gpu.focus = {index}

    def _run(self) -> None:
        # No renice: the thread needs < 1% of a core (BENCHMARKS.md), and it has to keep sampling exactly when the
        # cores are saturated. At nice 19 eight busy DataLoader workers on two cores starved it for whole seconds,
        # so a CPU-starved run came back without the CPU figures that prove it.
        due = time.monotonic()
        while not self._stop.is_set():
            spent = time.thread_time()
            row: Row = {"t_mono": time.monotonic()}
            row.update(self.host.read())
            row.update(self.gpu.read())
            self.trace.rows.append(row)
            self.trace.cpu_s += time.thread_time() - spent
            due += self.interval_s
            pause = due - time.monotonic()
            if pause < 0:  # a slow read: skip the missed ticks rather than bunching samples
                due, pause = time.monotonic(), 0.0
            self._stop.wait(pause)


def overlap_mean(trace: Trace, column: str, windows: Sequence[Window]) -> float | None:
    """Mean of ``column`` weighted by how much of each sample's period falls inside ``windows``.

    A row's value covers the period since the previous row, so a 5 ms data wait inside a 100 ms sample gets 5% of
    that sample's weight. None when no answered sample overlaps the windows.
    """
    total = weight = 0.0
    prev: float | None = None
    for row in trace.rows:
        t, v = row.get("t_mono"), row.get(column)
        if t is None:
            continue
        if prev is not None and v is not None:
            w = sum(max(0.0, min(t, b) - max(prev, a)) for a, b in windows)
            total, weight = total + w * v, weight + w
        prev = t
    return total / weight if weight > 0 else None


def quantiles(values: Iterable[float]) -> dict[str, float] | None:
    """p5 / p50 / p95 / max / mean of ``values`` (None when empty)."""
    data = sorted(values)
    if not data:
        return None

    def at(q: float) -> float:
        return data[min(len(data) - 1, max(0, round(q * (len(data) - 1))))]

    stats = {"p5": at(0.05), "p50": at(0.5), "p95": at(0.95), "max": data[-1], "mean": statistics.fmean(data)}
    return {k: round(v, 3) for k, v in stats.items()}


def summarise(trace: Trace, gpu: int | None, usable_cores: float) -> dict[str, Any]:
    """Summarise a trace for the JSON report: GPU ``gpu`` (None: the busiest), CPU, the process tree, overhead."""
    gpu = gpu if gpu is not None else busiest_gpu(trace)
    span = _span(trace)
    out: dict[str, Any] = {
        "samples": len(trace.rows),
        "interval_s": trace.interval_s,
        "seconds": round(span, 2),
        "cpu_pct": quantiles(trace.values("cpu_pct")),
        "cpu_max_core_pct": quantiles(trace.values("cpu_max_core_pct")),
        "iowait_pct": quantiles(trace.values("iowait_pct")),
        "tree_cpu_fraction": quantiles(v / usable_cores for v in trace.values("tree_cpu_cores")),
        "worker_cpu_cores": quantiles(trace.values("worker_cpu_cores")),
        "usable_cores": usable_cores,
        "overhead": {
            "cpu_ms_per_sample": round(1000 * trace.cpu_s / max(1, len(trace.rows)), 3),
            "core_fraction": round(trace.cpu_s / span, 4) if span > 0 else None,
        },
    }
    if gpu is not None:
        out["gpu"] = gpu_summary(trace, gpu)
    return out


def gpu_summary(trace: Trace, gpu: int) -> dict[str, Any]:
    """Utilisation, memory, power, clocks, clock-event reasons seen, PCIe throughput of one GPU."""
    p = f"gpu{gpu}_"
    reasons = 0
    for value in trace.values(p + "clock_reasons"):
        reasons |= int(value)
    total = trace.values(p + "mem_total_mib")
    return {
        "index": gpu,
        "util_pct": quantiles(trace.values(p + "util_pct")),
        "mem_util_pct": quantiles(trace.values(p + "mem_util_pct")),
        "mem_used_mib_max": max(trace.values(p + "mem_used_mib"), default=None),
        "mem_total_mib": total[0] if total else None,
        "power_w": quantiles(trace.values(p + "power_w")),
        "sm_mhz": quantiles(trace.values(p + "sm_mhz")),
        "sm_max_mhz": max(trace.values(p + "sm_max_mhz"), default=None),
        "clock_reasons_seen": reasons,
        "pcie_tx_mb_s": quantiles(trace.values(p + "pcie_tx_mb_s")),
        "pcie_rx_mb_s": quantiles(trace.values(p + "pcie_rx_mb_s")),
    }


def busiest_gpu(trace: Trace) -> int | None:
    """Return the GPU with the highest median utilisation (None without GPU columns)."""
    gpus = trace.gpus()
    medians = {g: statistics.median(trace.values(f"gpu{g}_util_pct") or [0.0]) for g in gpus}
    return max(gpus, key=lambda g: medians[g]) if gpus else None


def _span(trace: Trace) -> float:
    times = trace.values("t_mono")
    return times[-1] - times[0] if len(times) > 1 else 0.0
