"""The sampler: NVML readings through the fake at the adapter's seam, psutil readings of a real process tree,
the thread's cadence, the CSV format, and the statistics the verdicts read."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.probe.sample import HostReader
from checks.verify.sampler import Sampler, Trace, busiest_gpu, overlap_mean, quantiles, read_csv, summarise


class Counting:
    """A reader that counts its calls and costs a known amount of CPU."""

    def __init__(self) -> None:
        self.calls = 0
        self.error = None

    def __enter__(self) -> Counting:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def read(self) -> dict[str, float | None]:
        self.calls += 1
        return {"cpu_pct": float(self.calls)}


def test_sampler_thread_keeps_its_cadence_and_stops() -> None:
    gpu, host = Counting(), Counting()
    with Sampler(0.02, gpu, host) as sampler:  # type: ignore[arg-type]
        time.sleep(0.3)
    rows = sampler.trace.rows
    assert 10 <= len(rows) <= 18
    gaps = [b["t_mono"] - a["t_mono"] for a, b in itertools.pairwise(rows)]  # type: ignore[operator]
    assert 0.015 < sorted(gaps)[len(gaps) // 2] < 0.03
    calls = host.calls
    time.sleep(0.05)
    assert host.calls == calls and sampler.stop() is sampler.trace  # stopped, and stop() again is harmless


@pytest.mark.slow
def test_sampler_keeps_sampling_while_every_core_is_saturated() -> None:
    # Its figures matter most when the CPU is the bottleneck: with four busy processes per core (8 DataLoader
    # workers on 2 cores) a niced sampler thread went without the CPU for over a second at a time.
    burn = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(4 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.5)  # let them fill the run queues
        with Sampler(0.05, Counting(), HostReader(pid=os.getpid())) as sampler:  # type: ignore[arg-type]
            time.sleep(1.5)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    rows = sampler.trace.rows
    gaps = [b["t_mono"] - a["t_mono"] for a, b in itertools.pairwise(rows)]  # type: ignore[operator]
    assert len(rows) >= 15, len(rows)  # 30 due
    assert max(gaps) < 0.5, max(gaps)


def trace(rows: list[dict[str, float | None]]) -> Trace:
    return Trace(rows, 0.1)


def test_csv_round_trip_keeps_values_and_empty_cells(tmp_path: Path) -> None:
    t = trace(
        [
            {"t_mono": 10.0, "cpu_pct": 50.5, "gpu0_util_pct": None},
            {"t_mono": 10.1, "cpu_pct": 7.0, "gpu0_util_pct": 99.0},
        ]
    )
    t.write_csv(tmp_path / "s.csv")
    text = (tmp_path / "s.csv").read_text().splitlines()
    assert text[0] == "t_mono,t_s,cpu_pct,gpu0_util_pct" and text[1] == "10,0,50.5,"
    back = read_csv(tmp_path / "s.csv")
    assert back.values("gpu0_util_pct") == [99.0] and back.values("cpu_pct") == [50.5, 7.0]


def test_overlap_mean_weights_each_sample_by_its_overlap_with_the_windows() -> None:
    t = trace([{"t_mono": 0.0, "c": 0.0}, {"t_mono": 1.0, "c": 100.0}, {"t_mono": 2.0, "c": 0.0}])
    assert overlap_mean(t, "c", [(0.5, 1.0)]) == 100.0  # only the first period (0, 1] overlaps
    assert overlap_mean(t, "c", [(0.5, 1.5)]) == 50.0
    assert overlap_mean(t, "c", [(5.0, 6.0)]) is None


def test_quantiles_and_summary() -> None:
    assert quantiles([]) is None
    q = quantiles(float(v) for v in range(101))
    assert q == {"p5": 5.0, "p50": 50.0, "p95": 95.0, "max": 100.0, "mean": 50.0}
    rows: list[dict[str, float | None]] = [
        {"t_mono": float(i), "cpu_pct": 10.0, "tree_cpu_cores": 1.0, "gpu1_util_pct": 90.0, "gpu0_util_pct": 5.0}
        for i in range(5)
    ]
    s = summarise(Trace(rows, 0.1, cpu_s=0.04), None, 2.0)
    assert busiest_gpu(Trace(rows)) == 1 and s["gpu"]["index"] == 1
    assert s["tree_cpu_fraction"]["p50"] == 0.5
    assert s["overhead"] == {"cpu_ms_per_sample": 8.0, "core_fraction": 0.01}
