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
from checks.verify import sampler as sampler_mod
from checks.verify.sampler import Sampler, Trace, busiest_gpu, overlap_mean, quantiles, read_csv, summarise
from tests.waiting import until


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


class Ticking:
    """The sampler's clock and stop event in one: waiting moves the clock, and the event is set after ``ticks``
    waits. Reads that cost time move it with ``cost``."""

    def __init__(self, ticks: int) -> None:
        self.now, self.ticks, self.waits = 1000.0, ticks, list[float]()

    def monotonic(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return 0.0

    def cost(self, seconds: float) -> None:
        self.now += seconds

    def is_set(self) -> bool:
        return len(self.waits) >= self.ticks

    def set(self) -> None:
        self.ticks = 0

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return self.is_set()


class Costly(Counting):
    """A counting reader whose n-th read moves the clock by ``costs[n]``."""

    def __init__(self, clock: Ticking, costs: dict[int, float]) -> None:
        super().__init__()
        self.clock, self.costs = clock, costs

    def read(self) -> dict[str, float | None]:
        row = super().read()
        self.clock.cost(self.costs.get(self.calls, 0.0))
        return row


def test_sampler_samples_on_its_cadence_and_skips_the_ticks_a_slow_read_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Ticking(ticks=8)
    monkeypatch.setattr(sampler_mod, "time", clock)
    host = Costly(clock, {3: 0.05})  # the third read takes 50 ms: two and a half ticks of 20 ms
    sampler = Sampler(0.02, Counting(), host)  # type: ignore[arg-type]
    sampler._stop = clock  # type: ignore[assignment]
    with sampler:
        until(lambda: not sampler._thread.is_alive(), 10, what="the sampler to stop after 8 ticks")
    t = [row["t_mono"] - 1000.0 for row in sampler.trace.rows]  # type: ignore[operator]
    # 20 ms apart; the slow read ends at 0.09, past the ticks at 0.06 and 0.08: the next read is at once, not three
    assert t == pytest.approx([0.0, 0.02, 0.04, 0.09, 0.11, 0.13, 0.15, 0.17])
    assert clock.waits == pytest.approx([0.02, 0.02, 0.0, 0.02, 0.02, 0.02, 0.02, 0.02])


def test_sampler_thread_samples_until_stopped() -> None:
    gpu, host = Counting(), Counting()
    with Sampler(0.02, gpu, host) as sampler:  # type: ignore[arg-type]
        until(lambda: len(sampler.trace.rows) >= 3, 10, what="three samples")
    assert not sampler._thread.is_alive()  # joined: nothing reads after the block
    calls = host.calls
    assert sampler.stop() is sampler.trace and host.calls == calls == len(sampler.trace.rows) == gpu.calls
    assert all(row["cpu_pct"] == i for i, row in enumerate(sampler.trace.rows, 1))  # each read once, in order


@pytest.mark.slow
@pytest.mark.measures  # rows and gaps against bounds, with the cores saturated on purpose
def test_sampler_keeps_sampling_while_every_core_is_saturated() -> None:
    # Its figures matter most when the CPU is the bottleneck: with four busy processes per core (8 DataLoader
    # workers on 2 cores) a niced sampler thread went without the CPU for over a second at a time.
    burn = "import time\nprint(flush=True)\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"
    hogs = [
        subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE) for _ in range(4 * (os.cpu_count() or 1))
    ]
    try:
        for hog in hogs:  # every one is burning: the run queues are full
            assert hog.stdout is not None and hog.stdout.readline() == b"\n"
        with Sampler(0.05, Counting(), HostReader(pid=os.getpid())) as sampler:  # type: ignore[arg-type]
            time.sleep(1.5)  # the window sampled under that load
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
