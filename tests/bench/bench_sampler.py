"""Benchmark: what the verify/watch sampler costs the training it watches.

Run from the repository root:  python tests/bench/bench_sampler.py [--steps N] [--block SECONDS]
It rewrites the "sampler" section of BENCHMARKS.md. Two measurements, same run, same cores:

1. The sampler thread's own CPU time per sample (``time.thread_time`` around each read), and as a fraction of one
   core at the default 10 Hz. This is what it can take from the training on a saturated machine.
2. The smoke loop's step time with the sampler running vs not, in one run whose sampler is switched on and off
   every few seconds, so a neighbour's load hits both arms alike. Target: overhead under 2% of step time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.probe.host import read_host  # noqa: E402
from checks.probe.sample import GpuReader, HostReader  # noqa: E402
from checks.probe.torch import read_torch  # noqa: E402
from checks.verify.contract import RunSpec, Step  # noqa: E402
from checks.verify.sampler import Sampler  # noqa: E402
from checks.verify.smoke.launch import launch  # noqa: E402
from checks.verify.staged import synthetic_spec  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:sampler:begin -->", "<!-- bench:sampler:end -->"
INTERVAL = 0.1


def spec(steps: int) -> RunSpec:
    """The built-in small CNN on 32 px synthetic images, batch 32, one worker: ~75 ms steps on two cores."""
    return RunSpec.from_json({
        "device": "cpu", "precision": "auto", "model_size": "small", "dataset": "", "model": "", "user_path": str(ROOT),
        "data": synthetic_spec("images", 32, 10, 0).as_dict(), "batch_size": 32, "batch_size_cpu": 32,
        "batch_size_gpu": 32, "accum": 1, "warmup": 3, "steps": steps, "lr": 1e-3, "seed": 0, "profile_steps": 0,
        "loader": {"num_workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2},
        "checkpoint": None, "sweep": None, "ab": None,
    })  # fmt: skip


def toggled(steps: int, block_s: float) -> dict[str, Any]:
    """One long run; the sampler is switched on and off every ``block_s`` seconds while it trains.

    Steps wholly inside an "on" block are compared with those of the "off" blocks on either side of it (a paired
    ratio per block), so a neighbour's load that comes and goes over seconds hits both arms alike.
    """
    started, done, blocks = threading.Event(), threading.Event(), []
    host = HostReader(usable=2.0)
    cpu, samples = [0.0], [0]

    def control() -> None:
        started.wait()
        time.sleep(8.0)  # the child's setup, FLOP count and warm-up
        on = False
        while not done.is_set():
            a = time.monotonic()
            if on:
                with Sampler(INTERVAL, GpuReader(), host) as sampler:
                    done.wait(block_s)
                cpu[0] += sampler.trace.cpu_s
                samples[0] += len(sampler.trace.rows)
            else:
                done.wait(block_s)
            blocks.append((a, time.monotonic(), on))
            on = not on

    def begin(pid: int) -> None:
        host.pid = pid
        started.set()

    thread = threading.Thread(target=control, daemon=True)
    thread.start()
    run = launch(spec(steps), 600, 120, on_start=begin)
    done.set()
    thread.join()
    assert run.result is not None, run.log_tail
    return _paired(run.result.steps, blocks) | {"cpu_ms": 1000 * cpu[0] / max(1, samples[0])}


def _paired(records: tuple[Step, ...], blocks: list[tuple[float, float, bool]]) -> dict[str, Any]:
    def median_in(a: float, b: float) -> float | None:
        inside = [r.total for r in records if r.host_start >= a and r.host_end <= b]
        return statistics.median(inside) if len(inside) >= 3 else None

    medians = [(median_in(a, b), on) for a, b, on in blocks]
    ratios = []
    for i in range(1, len(medians) - 1):
        (m, on), before, after = medians[i], medians[i - 1][0], medians[i + 1][0]
        if on and m and before and after:
            ratios.append(m / ((before + after) / 2) - 1)
    ratios.sort()
    ons = [m for m, on in medians if on and m]
    offs = [m for m, on in medians if not on and m]
    return {
        "off": statistics.median(offs),
        "on": statistics.median(ons),
        "overhead": statistics.median(ratios),
        "iqr": (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]),
        "pairs": len(ratios),
    }


def idle_cost(seconds: float, reader: Callable[[], HostReader]) -> float:
    """CPU ms per sample of the sampler alone, watching this process (no training competing)."""
    with Sampler(INTERVAL, GpuReader(), reader()) as sampler:
        time.sleep(seconds)
    return 1000 * sampler.trace.cpu_s / max(1, len(sampler.trace.rows))


def machine_line() -> str:
    host, torch = read_host(), read_torch()
    ram = f"{(host.mem_total or 0) / 1024**3:.0f} GiB RAM"
    return f"{host.cpu_model or platform.processor()}, {host.cpu_affinity} usable cores, {ram}, Python {platform.python_version()}, torch {torch.version}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--block", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory():
        alone = idle_cost(5.0, lambda: HostReader(pid=None))
        tree = idle_cost(5.0, lambda: HostReader(pid=os.getpid()))
        ab = toggled(args.steps, args.block)
    rows = [
        (
            "sampler CPU per sample, machine-wide CPU only",
            f"{alone:.2f} ms ({alone / 1000 / INTERVAL:.2%} of a core at 10 Hz)",
        ),
        (
            "sampler CPU per sample, with a process tree",
            f"{tree:.2f} ms ({tree / 1000 / INTERVAL:.2%} of a core at 10 Hz)",
        ),
        (
            "sampler CPU per sample, during training",
            f"{ab['cpu_ms']:.2f} ms ({ab['cpu_ms'] / 1000 / INTERVAL:.2%} of a core)",
        ),
        ("median step, sampler off (median of blocks)", f"{1000 * ab['off']:.1f} ms"),
        ("median step, sampler on (median of blocks)", f"{1000 * ab['on']:.1f} ms"),
        (
            f"step-time overhead, median of {ab['pairs']} on-blocks vs their off neighbours",
            f"{100 * ab['overhead']:+.2f}% (interquartile {100 * ab['iqr'][0]:+.1f}% .. {100 * ab['iqr'][1]:+.1f}%)",
        ),
        (
            "sampler CPU during training, share of one core",
            f"{ab['cpu_ms'] / 1000 / INTERVAL:.2%} (target: overhead < 2% of step time)",
        ),
    ]
    table = ["| measurement | result |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    section = "\n".join(
        [
            BEGIN,
            "## sampler (verify / watch)",
            "",
            f"Machine: {machine_line()}; load average {os.getloadavg()[0]:.1f} at the end (a shared box).",
            f"`python tests/bench/bench_sampler.py --steps {args.steps} --block {args.block:g}`:",
            "the smoke loop's small CNN on 32 px images, batch 32, one DataLoader worker, on the CPU, in one run whose",
            f"sampler thread (10 Hz) is switched on and off every {args.block:g} s. No NVIDIA driver here, so the NVML reads are",
            "absent from these numbers: on a GPU each sample adds the driver queries (microseconds) and two PCIe",
            "throughput reads of the GPU in use, which block the sampler thread ~20 ms each (NVML counts bytes over",
            "20 ms) without using CPU or holding the GIL (ctypes releases it). The sampler's CPU time per sample is the",
            "robust figure: it is all the sampler can take from the training. The wall-clock A/B resolves a few percent",
            "at best on a shared 2-core box. The sampler thread runs at the tool's normal priority: it sleeps between",
            "samples and takes well under 1% of a core, and at nice 19 it was starved for whole seconds exactly when",
            "the cores were saturated (eight busy DataLoader workers on two cores), the case its figures must show.",
            "",
            *table,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
