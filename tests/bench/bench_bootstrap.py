"""Benchmark: where `invoke bootstrap`'s time goes, live vs replayed, side by side in one run.

Run from the repository root:  python tests/bench/bench_bootstrap.py [--repeats N]
It rewrites the "bootstrap" section of BENCHMARKS.md with the numbers and the machine they ran on.
The target it watches: a live bootstrap under 60 s on a machine without a GPU (the foundation issue's
"done means"); with GPUs the micro-benchmarks add their own configured budget (preflight.bench).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.machine.runner import run_checks  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from checks.probe.nvml import read_nvml  # noqa: E402
from checks.probe.torch import read_torch  # noqa: E402
from checks.snapshot import load_snapshot  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:bootstrap:begin -->", "<!-- bench:bootstrap:end -->"
FIXTURES = ROOT / "tests" / "fixtures" / "machines"


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def invoke_bootstrap(*args: str) -> None:
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_PREFLIGHT_")}
        env.update(HOME=home, NO_COLOR="1")
        subprocess.run(
            [sys.executable, "-m", "invoke", "bootstrap", *args, "--json", f"{home}/r.json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


def replay_all() -> None:
    cfg = make_config()
    for path in sorted(FIXTURES.glob("*.json")):
        run_checks(load_snapshot(path)[0], cfg)


def machine_line() -> str:
    host = read_host()
    torch = read_torch()
    cpu = host.cpu_model or platform.processor() or "unknown CPU"
    ram = f"{(host.mem_total or 0) / 1024**3:.0f} GiB RAM"
    gpus = read_nvml()
    gpu = f"{len(gpus.gpus)} GPU(s)" if not gpus.error else "no GPU"
    return f"{cpu}, {host.cpu_affinity} usable cores, {ram}, {gpu}, Python {platform.python_version()}, torch {torch.version}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    fixtures = len(list(FIXTURES.glob("*.json")))
    rows = [
        ("NVML read (read_nvml)", median_seconds(read_nvml, repeats)),
        ("host facts (read_host)", median_seconds(read_host, repeats)),
        ("torch probe child (read_torch)", median_seconds(read_torch, repeats)),
        (f"judge all {fixtures} fixtures (run_checks)", median_seconds(replay_all, repeats)),
        ("`invoke bootstrap` live, --no-bench", median_seconds(lambda: invoke_bootstrap("--no-bench"), repeats)),
        ("`invoke bootstrap` live (benchmarks on)", median_seconds(invoke_bootstrap, repeats)),
        (
            "`invoke bootstrap --machine <fixture>` replay",
            median_seconds(lambda: invoke_bootstrap("--machine", str(FIXTURES / "h100-sxm-8x-healthy.json")), repeats),
        ),
    ]
    table = ["| step | median seconds |", "|---|---|"] + [f"| {name} | {sec:.3f} |" for name, sec in rows]
    section = "\n".join(
        [
            BEGIN,
            "## bootstrap",
            "",
            f"Machine: {machine_line()}. Median of {repeats} runs, `python tests/bench/bench_bootstrap.py`.",
            "Target: a live bootstrap well under 60 s on a machine without a GPU. The live rows include the torch",
            "probe child, the allocator read-back (a login shell that imports torch) and the disk measurements",
            "(preflight.disk budget per location). Without a GPU the",
            "micro-benchmarks skip, so the two live rows do the same work and differ only by noise.",
            "",
            *table,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
