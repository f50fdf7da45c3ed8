"""The sampler: NVML readings through the fake at the adapter's seam, psutil readings of a real process tree,
the thread's cadence, the CSV format, and the statistics the verdicts read."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from checks.probe.sample import GpuReader, HostReader
from checks.verify.sampler import Sampler, Trace, busiest_gpu, overlap_mean, quantiles, read_csv, summarise
from tests.checks.probe.test_nvml import FakeNvml, h100

TX, RX = 0, 1


def sampled_h100(index: int = 0, util: int = 87) -> dict[str, Any]:
    return h100(index) | {
        "GetUtilizationRates": SimpleNamespace(gpu=util, memory=31),
        "GetPcieThroughput": lambda counter: {TX: 1000, RX: 24_000_000}[counter],  # KiB/s
    }


def test_gpu_reader_reads_every_column_in_plain_units() -> None:
    with GpuReader(FakeNvml([sampled_h100()])) as reader:
        row = reader.read()
    assert row["gpu0_util_pct"] == 87.0 and row["gpu0_mem_util_pct"] == 31.0
    assert row["gpu0_power_w"] == pytest.approx(71.234)
    assert (row["gpu0_sm_mhz"], row["gpu0_sm_max_mhz"], row["gpu0_clock_reasons"]) == (346, 1981, 0x1)
    assert row["gpu0_pcie_rx_mb_s"] == pytest.approx(24_000_000 * 1024 / 1e6, rel=1e-3)
    assert row["gpu0_mem_used_mib"] == pytest.approx(1024.0) and row["gpu0_mem_total_mib"] == 80 * 1024


def test_focus_limits_the_20ms_pcie_reads_to_one_gpu() -> None:
    fake = FakeNvml([sampled_h100(0), sampled_h100(1)])
    with GpuReader(fake) as reader:
        reader.focus = {reader.index_of("GPU-5d0a8c1e-0000-0000-0000-000000000001")}  # type: ignore[arg-type]
        fake.calls.clear()
        row = reader.read()
    assert fake.calls.count("nvmlDeviceGetPcieThroughput") == 2
    assert "gpu1_pcie_tx_mb_s" in row and "gpu0_pcie_tx_mb_s" not in row
    assert "gpu0_util_pct" in row  # the cheap columns are still read for every GPU


def test_unsupported_fields_are_none_and_a_lost_gpu_is_dropped() -> None:
    lost = sampled_h100(1) | {"GetUtilizationRates": pynvml.NVMLError_GpuIsLost}
    bare = sampled_h100(0) | {"GetPcieThroughput": pynvml.NVMLError_NotSupported}
    with GpuReader(FakeNvml([bare, lost])) as reader:
        first, second = reader.read(), reader.read()
    assert first["gpu0_pcie_tx_mb_s"] is None
    assert reader.indices == [0] and not any(k.startswith("gpu1_") for k in second)


def test_without_nvml_the_reader_is_inert_and_says_why() -> None:
    with GpuReader(FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())) as reader:
        assert reader.read() == {}
    assert reader.error and "could not load" in reader.error


def test_host_reader_measures_a_process_tree_and_its_descendants() -> None:
    burn = "import time\nt = time.time()\nwhile time.time() - t < 2.5: pass"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        reader = HostReader(pid=proc.pid, usable=2.0)
        rows = []
        for _ in range(12):
            time.sleep(0.15)
            rows.append(reader.read())
    finally:
        proc.kill()
        proc.wait()
    busy = [v for r in rows[-6:] if (v := r.get("worker_cpu_cores")) is not None]
    assert rows[-1]["workers"] == 1.0  # the burning grandchild is counted as a worker
    assert busy and max(busy) > 0.5  # it keeps a core busy
    assert {"cpu_pct", "cpu_max_core_pct", "iowait_pct", "core0_pct"} <= set(rows[-1])


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
