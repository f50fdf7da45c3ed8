"""Benchmark: what the verify/watch sampler costs the training it watches.

Run from the repository root:  python tests/bench/bench_sampler.py [--seconds S] [--block SECONDS]
It rewrites the "sampler" section of BENCHMARKS.md. Two measurements, same run, same cores:

1. The sampler thread's own CPU time per sample (``time.thread_time`` around each read), and as a fraction of one
   core at the default 10 Hz. This is what it can take from the training on a saturated machine.
2. The step time of the tool's training script (``templates/train.py``, run under the injected agent by
   ``checks/verify/user/launch.py::run_command`` as ``invoke verify`` runs it) with the sampler running vs not, in
   one run whose sampler is switched on and off every few seconds, so a neighbour's load hits both arms alike.
   Target: overhead under 2% of step time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
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
from checks.verify.events import StepLine  # noqa: E402
from checks.verify.sampler import Sampler  # noqa: E402
from checks.verify.user.launch import StopRule, run_command  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:sampler:begin -->", "<!-- bench:sampler:end -->"
INTERVAL = 0.1
WARMUP = 3
SCRIPT = ROOT / "templates" / "train.py"


def command() -> list[str]:
    """The tool's script with its built-in small CNN on 32 px synthetic images, batch 32, one worker, on the CPU;
    no checkpoint. It would train for hours: verify's stop rule ends it (here after a time), as in ``invoke verify``."""
    return [
        sys.executable, str(SCRIPT), "--data", "synthetic-images", "--size", "small", "--image-size", "32",
        "--classes", "10", "--batch-size", "32", "--workers", "1", "--device", "cpu", "--precision", "fp32",
        "--steps", "1000000", "--log-every", "1000000",
    ]  # fmt: skip


def toggled(seconds: float, block_s: float) -> dict[str, Any]:
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
    # measured for ``seconds`` after the warm-up (``verify --seconds``): bounded on a box whose load slows the steps
    rule = StopRule(WARMUP, 1, seconds=seconds, first_step_s=300.0, stall_s=120.0, limit_s=seconds + 300.0)
    t0 = time.monotonic()
    run = run_command(command(), rule, str(ROOT), None, subprocess.DEVNULL, on_start=begin)
    wall = time.monotonic() - t0
    done.set()
    thread.join()
    records = [e for e in run.events if isinstance(e, StepLine) and e.i > WARMUP]
    assert run.ended == "stopped" and records, (run.ended, run.traceback())
    return _paired(records, blocks) | {
        "cpu_ms": 1000 * cpu[0] / max(1, samples[0]),
        "steps": len(records),
        "wall": wall,
    }


def _paired(records: list[StepLine], blocks: list[tuple[float, float, bool]]) -> dict[str, Any]:
    """The agent's step lines (``host_start``/``host_end``: the script's ``time.monotonic``, the same clock as
    this process's on Linux) in each block; a step's time is the sum of its phases, as the judge's."""

    def median_in(a: float, b: float) -> float | None:
        inside = [r.seconds for r in records if r.host_start >= a and r.host_end <= b]
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
    if not ratios or not ons or not offs:
        raise SystemExit(f"no on-block with off neighbours held 3 whole steps: {len(records)} steps, {medians}")
    return {
        "off": statistics.median(offs),
        "on": statistics.median(ons),
        "overhead": statistics.median(ratios),
        "iqr": (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]),
        "pairs": len(ratios),
        "on_blocks": sum(1 for _, _, on in blocks if on),
        "slow_blocks": sum(1 for m, _ in medians if m is None),
        "blocks": len(blocks),
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


# What this section held before, measured on the removed built-in loop (its smoke child launched by
# checks/verify/smoke/launch.py; AMD EPYC, 2 usable cores, 600 steps (--steps 600), --block 2, load average 2.1 at
# the end),
# quoted as it was, by row.
BEFORE = (
    "0.39 ms (0.39% of a core at 10 Hz)",
    "0.69 ms (0.69% of a core at 10 Hz)",
    "0.65 ms (0.65% of a core)",
    "130.1 ms",
    "130.9 ms",
    "+0.82% over 19 on-blocks (interquartile -0.8% .. +9.6%)",
    "0.65%",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds after the warm-up")
    parser.add_argument("--block", type=float, default=2.0)
    args = parser.parse_args()
    # One intra-op thread in the script, as the other benches and the tests: with two on a 2-core box that other
    # jobs share, torch's threads wait on each other and a step took ~3 s instead of ~0.3 s (load average 5).
    os.environ["OMP_NUM_THREADS"] = "1"
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory():
        alone = idle_cost(5.0, lambda: HostReader(pid=None))
        tree = idle_cost(5.0, lambda: HostReader(pid=os.getpid()))
        ab = toggled(args.seconds, args.block)
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
            "step-time overhead, median of the on-blocks vs their off neighbours",
            f"{100 * ab['overhead']:+.2f}% over {ab['pairs']} of {ab['on_blocks']} on-blocks (interquartile "
            f"{100 * ab['iqr'][0]:+.1f}% .. {100 * ab['iqr'][1]:+.1f}%)",
        ),
        (
            "sampler CPU during training, share of one core",
            f"{ab['cpu_ms'] / 1000 / INTERVAL:.2%} (target: overhead < 2% of step time)",
        ),
    ]
    table = ["| measurement | result | before (built-in loop) |", "|---|---|---|"] + [
        f"| {a} | {b} | {was} |" for (a, b), was in zip(rows, BEFORE, strict=True)
    ]
    section = "\n".join(
        [
            BEGIN,
            "## sampler (verify / watch)",
            "",
            f"Machine: {machine_line()}; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
            "(a shared box).",
            f"`python tests/bench/bench_sampler.py --seconds {args.seconds:g} --block {args.block:g}`:",
            "the tool's training script `templates/train.py` (its built-in small CNN, `--size small`, on 32 px",
            "synthetic images, batch 32, one DataLoader worker, one intra-op thread, fp32, no checkpoint) on the CPU,",
            "run under the",
            "injected agent by `checks/verify/user/launch.py::run_command` as `invoke verify` runs it and stopped by",
            f"its rule after {WARMUP} warm-up steps and {args.seconds:g} s measured ({ab['steps']} steps), in one run whose sampler thread",
            f"(10 Hz) is switched on and off every {args.block:g} s; a step's time is the sum of its phases in the",
            f"agent's step line. The run took {ab['wall']:.0f} s; {ab['slow_blocks']} of its {ab['blocks']} blocks",
            "held fewer than 3 whole measured steps (the script's start-up, or steps the box's other jobs slowed)",
            "and pair with nothing.",
            "The figures before were measured on the removed built-in loop's child (the same",
            "model, data and batch), not on the tool's script. No NVIDIA driver here, so the NVML reads are",
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
