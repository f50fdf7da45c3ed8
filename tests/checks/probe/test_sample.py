"""The sampling seam: the GPU reader against a fake NVML that raises the real error classes, the host and
process readers against real processes."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml
import pytest

from checks.probe.sample import GpuReader, HostReader, process_exists, process_tree
from tests.fakes.nvml import FakeNvml, h100
from tests.waiting import until

PARENT = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']) for _ in range(2)]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "time.sleep(30)\n"
)


def test_process_tree_finds_the_children_of_a_real_process() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        kids = {int(p) for p in parent.stdout.readline().split()}
        assert process_tree(parent.pid) == {parent.pid, *kids}
        assert process_exists(parent.pid)
    finally:
        for pid in process_tree(parent.pid) - {parent.pid}:
            subprocess.run(["kill", str(pid)], check=False)
        parent.kill()
        parent.wait()


def test_an_exited_process_does_not_exist_and_its_tree_is_itself() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process_exists(child.pid)
    assert process_tree(child.pid) == {child.pid}


def test_a_zombie_does_not_count_as_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # not reaped yet: a zombie until wait()
        if not process_exists(child.pid):
            break
        subprocess.run(["sleep", "0.01"], check=False)
    assert not process_exists(child.pid)
    child.wait()


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


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far, from /proc/PID/stat (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def samples(reader: HostReader, n: int) -> list[dict[str, Any]]:
    """``n`` readings 0.15 s apart (each reading covers the time since the one before), stamped ``t`` here."""
    rows = []
    for _ in range(n):
        time.sleep(0.15)  # the sampling interval: a reading is a rate over the time since the last one
        rows.append(reader.read() | {"t": time.monotonic()})
    return rows


@pytest.mark.slow
@pytest.mark.measures
def test_host_reader_measures_a_process_tree_and_its_descendants() -> None:
    """The reader's figure for the burning grandchild is the CPU /proc says it got, however loaded the box is."""
    burn = "import time\nt = time.time()\nwhile time.time() - t < 2.5: pass"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        reader = HostReader(pid=proc.pid, usable=2.0)
        rows = samples(reader, 6)
        burners = process_tree(proc.pid) - {proc.pid}
        start, cpu = rows[-1]["t"], {b: cpu_seconds(b) for b in burners}  # what it really gets from now on
        rows += samples(reader, 6)
        share = sum(cpu_seconds(b) - cpu[b] for b in burners) / (time.monotonic() - start)
    finally:
        proc.kill()
        proc.wait()
    assert rows[-1]["workers"] == 1.0  # the burning grandchild is counted as a worker
    assert {"cpu_pct", "cpu_max_core_pct", "iowait_pct", "core0_pct"} <= set(rows[-1])
    if share < 0.1:  # a reader stuck at 0 would match that too
        pytest.skip(f"the box is busy: the burning process got {share:.2f} of a core, this test needs 0.1 or more")
    window = [(r["worker_cpu_cores"], r["t"] - before["t"]) for before, r in itertools.pairwise(rows[-7:])]
    seen = sum(cores * dt for cores, dt in window) / sum(dt for _, dt in window)  # the same window as ``share``
    assert seen == pytest.approx(share, abs=0.05), (window, share)


def test_a_child_started_between_full_rescans_is_counted_at_the_next_read(tmp_path: Path) -> None:
    """DataLoader workers start with their iterator: the reader must not wait for its 2 s re-list of the tree."""
    go = tmp_path / "go"  # the child starts once the test has read the tree without it
    later = (
        "import os, subprocess, sys, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\ntime.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", later])
    try:
        reader = HostReader(pid=proc.pid, usable=2.0)
        assert reader.read()["workers"] == 0.0  # the full re-list, before the child exists
        go.touch()
        until(lambda: len(process_tree(proc.pid)) == 2, 20, what="the child to start")
        assert reader.read()["workers"] == 1.0  # well within the 2 s before the next full re-list
    finally:
        for pid in process_tree(proc.pid) - {proc.pid}:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_torch_and_nvml_uuids_match_by_the_one_rule_whatever_their_case_and_prefix() -> None:
    """torch >= 2.1 prints the UUID bare; NVML prefixes ``GPU-``; either may come upper-cased from a log."""
    with GpuReader(FakeNvml([sampled_h100(0), sampled_h100(1)])) as reader:
        assert reader.index_of("5d0a8c1e-0000-0000-0000-000000000001") == 1
        assert reader.index_of("GPU-5D0A8C1E-0000-0000-0000-000000000000") == 0
        assert reader.index_of("0000-000000000001") is None  # a suffix alone is not the GPU
        assert reader.index_of(None) is None


def test_a_gpu_without_a_handle_is_left_out_of_the_reader_and_the_others_are_read() -> None:
    gone = sampled_h100(0) | {"HandleByIndex": pynvml.NVMLError_GpuIsLost}
    with GpuReader(FakeNvml([gone, sampled_h100(1)])) as reader:
        row = reader.read()
    assert reader.indices == [1] and reader.uuids == {1: "GPU-5d0a8c1e-0000-0000-0000-000000000001"}
    assert "gpu1_util_pct" in row and not any(k.startswith("gpu0_") for k in row)


RANKS = """
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", WORKER], env=os.environ | {"LOCAL_RANK": str(r)}) for r in (0, 1)]
print("ready", flush=True)
time.sleep(30)
"""
WORKER = """
import os, time
if os.fork() == 0:  # a DataLoader worker: forked from its rank, with the rank's environment
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


def test_ranks_under_a_launcher_are_not_counted_as_loader_workers() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", f"WORKER = {WORKER!r}\n{RANKS}"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == b"ready"
        until(lambda: len(process_tree(launcher.pid)) == 5, 10, what="the launcher, 2 ranks and their 2 workers")
        row = HostReader(pid=launcher.pid).read()
        assert (row["ranks"], row["workers"]) == (2.0, 2.0), row
        rank = next(c.pid for c in psutil.Process(launcher.pid).children())  # watched directly: its worker stays one
        row = HostReader(pid=rank).read()
        assert (row["ranks"], row["workers"]) == (0.0, 1.0), row
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()
