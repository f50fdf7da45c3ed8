"""The sampling part of the seam: cheap NVML and psutil readings taken ~10 times a second.

``GpuReader`` reads utilisation, memory, power, SM clock, PCIe throughput and clock-event reasons through the
NVML adapter's single query helper (``probe_nvml.Query``), so "not supported" is ``None`` here too and a lost GPU
stops being read instead of raising. ``HostReader`` reads per-core CPU, iowait and the CPU time of one process
tree (a training process and its DataLoader workers). Neither ever raises once constructed; units are plain
(%, MiB, W, MHz, MB/s, CPU cores).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from checks.probe.nvml import Query, Unanswered, start_nvml, stop_nvml, uuid_key
from checks.units import MIB

# nvmlDeviceGetPcieThroughput counts bytes over a 20 ms window per call (NVML API reference): two calls per
# GPU per sample, so it is read only for the GPUs in focus.
_PCIE_TX, _PCIE_RX = 0, 1  # NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES
_CHILDREN_REFRESH_S = 2.0  # scanning /proc for children (~2 ms) is the expensive part; the tree changes rarely


def _mb_s(kib_per_s: Any) -> float | None:
    return None if kib_per_s is None else round(kib_per_s * 1024 / 1e6, 2)


class GpuReader:
    """Context manager over NVML: ``read()`` returns one dict of columns per GPU (``gpu<i>_<name>``).

    Without NVML (no driver, no library) it is inert: ``read()`` returns ``{}``. Command line equivalent:
    nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm,
    clocks_event_reasons.active --format=csv -lms 100 (plus nvidia-smi dmon -s t for PCIe throughput)
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._query: Query | None = None
        self._handles: dict[int, Any] = {}
        self._max_clock: dict[int, int | None] = {}
        self.uuids: dict[int, str | None] = {}
        self.focus: set[int] | None = None  # GPUs whose PCIe throughput is read; None: all
        self.error: str | None = None

    def __enter__(self) -> GpuReader:
        nvml, failure = start_nvml(self._nvml)
        if failure is not None:
            self.error = failure.error
            return self
        self._query = q = Query(nvml)
        self._handles = q.handles()
        for index, handle in self._handles.items():
            with contextlib.suppress(Unanswered):
                self.uuids[index] = q("nvmlDeviceGetUUID", handle)
                self._max_clock[index] = q("nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._query is not None:
            stop_nvml(self._query.nvml)
            self._query = None

    @property
    def indices(self) -> list[int]:
        """GPUs being read."""
        return sorted(self._handles)

    def index_of(self, uuid: str | None) -> int | None:
        """Return the NVML index of the GPU with ``uuid`` (torch and NVML can order GPUs differently)."""
        key = uuid_key(uuid) if uuid else None
        return next((i for i, u in self.uuids.items() if key and u and uuid_key(u) == key), None)

    def processes(self) -> dict[int, set[int]]:
        """PIDs with a CUDA context on each GPU (host PIDs: inside a container they may not match).

        Command line equivalent: nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv
        """
        q, out = self._query, {}
        if q is None:
            return {}
        for index, handle in self._handles.items():
            with contextlib.suppress(Unanswered):
                found = q("nvmlDeviceGetComputeRunningProcesses", handle) or []
                out[index] = {int(p.pid) for p in found}
        return out

    def read(self) -> dict[str, float | None]:
        """Read every GPU once; a GPU lost mid-run is dropped from later reads."""
        q = self._query
        if q is None:
            return {}
        q.errors.clear()
        row: dict[str, float | None] = {}
        for index in list(self._handles):
            try:
                row.update(self._read_one(q, index))
            except Unanswered:
                del self._handles[index]
        return row

    def _read_one(self, q: Query, index: int) -> dict[str, float | None]:
        h, nvml, p = self._handles[index], q.nvml, f"gpu{index}_"
        util, mem = q("nvmlDeviceGetUtilizationRates", h), q("nvmlDeviceGetMemoryInfo", h)
        power = q("nvmlDeviceGetPowerUsage", h)
        reasons = q("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        row = {
            p + "util_pct": None if util is None else float(util.gpu),
            p + "mem_util_pct": None if util is None else float(util.memory),
            p + "mem_used_mib": None if mem is None else round(mem.used / MIB, 1),
            p + "mem_total_mib": None if mem is None else round(mem.total / MIB, 1),
            p + "power_w": None if power is None else power / 1000.0,
            p + "sm_mhz": q("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM),
            p + "sm_max_mhz": self._max_clock.get(index),
            p + "clock_reasons": reasons,
        }
        if self.focus is None or index in self.focus:
            row[p + "pcie_tx_mb_s"] = _mb_s(q("nvmlDeviceGetPcieThroughput", h, _PCIE_TX))
            row[p + "pcie_rx_mb_s"] = _mb_s(q("nvmlDeviceGetPcieThroughput", h, _PCIE_RX))
        return row


class HostReader:
    """psutil readings: per-core CPU %, iowait %, and the CPU use of the process tree under ``pid``.

    ``cores`` restricts the per-core figures to the CPUs this process may run on (its affinity mask). Command line
    equivalent: mpstat -P ALL 1; pidstat -t -p PID 1
    """

    def __init__(self, pid: int | None = None, cores: Iterable[int] | None = None, usable: float | None = None):
        self.pid = pid
        self.cores = sorted(cores) if cores is not None else _affinity()
        self.usable = usable or float(len(self.cores)) or 1.0
        self._procs: dict[int, psutil.Process] = {}
        self._cpu_seen: dict[int, float] = {}
        self._retired = 0.0  # CPU seconds of descendants that have exited
        self._children_at = -1.0
        self._ranks: set[int] = set()  # descendants that are training processes of their own (torchrun's ranks)
        self._launched: dict[int, bool] = {}  # pid -> LOCAL_RANK in its environment (ranks_among's cache)
        self._last: tuple[float, float, float] | None = None  # (time, tree cpu s, worker cpu s)
        psutil.cpu_percent(percpu=True)  # prime the deltas
        psutil.cpu_times_percent()

    def read(self) -> dict[str, float | None]:
        """Read once; CPU figures are averages since the previous read."""
        per_core = psutil.cpu_percent(percpu=True)
        mine = [per_core[c] for c in self.cores if c < len(per_core)] or per_core
        row: dict[str, float | None] = {
            "cpu_pct": round(sum(mine) / max(1, len(mine)), 1),
            "cpu_max_core_pct": max(mine, default=None),
            "iowait_pct": getattr(psutil.cpu_times_percent(), "iowait", None),
        }
        row.update({f"core{c}_pct": per_core[c] for c in self.cores if c < len(per_core)})
        if self.pid is not None:
            row.update(self._tree())
        return row

    def _tree(self) -> dict[str, float | None]:
        """CPU cores used by the process and by its descendants (the DataLoader workers) since the last read."""
        now = time.monotonic()
        if now - self._children_at >= _CHILDREN_REFRESH_S or self._new_child():
            self._refresh_children()
            self._children_at = now
        main = self._cpu(self.pid)
        workers = self._retired + sum(
            self._cpu(pid) or 0.0 for pid in list(self._procs) if pid != self.pid and pid not in self._ranks
        )
        ranks_cpu = sum(self._cpu(pid) or 0.0 for pid in self._ranks)  # training processes: the tree's, not workers'
        total = None if main is None else main + workers + ranks_cpu
        last, self._last = self._last, (now, total or 0.0, workers)
        ranks = float(len(self._ranks))
        out: dict[str, float | None] = {
            "workers": float(len(self._procs) - 1 - len(self._ranks)) if self._procs else None,
            "ranks": ranks if self._procs else None,
        }
        if last is None or total is None or now <= last[0]:
            return {**out, "tree_cpu_cores": None, "worker_cpu_cores": None}
        dt = now - last[0]
        return {
            **out,
            "tree_cpu_cores": round(max(0.0, total - last[1]) / dt, 3),
            "worker_cpu_cores": round(max(0.0, workers - last[2]) / dt, 3),
        }

    def _new_child(self) -> bool:
        """A process of the tree has a child not yet listed: each one's main thread's children file in /proc, a few
        small reads a sample (where the kernel has no such file, the full re-list every ``_CHILDREN_REFRESH_S``).
        DataLoader workers start with their iterator: a short run's 4 busy workers went uncounted for the first
        2 s, nearly all of its measured waits, and the training processes read 22% of the cores on a box 100% busy
        with nothing else running (BENCHMARKS.md, time to verdict)."""
        for pid in list(self._procs) or ([self.pid] if self.pid is not None else []):
            try:
                listed = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            if any(int(child) not in self._procs for child in listed):
                return True
        return False

    def _refresh_children(self) -> None:
        """Re-list the descendants. An exited worker's CPU time stays in the totals; a new one counts from now."""
        try:
            root = self._procs.get(self.pid or -1) or psutil.Process(self.pid)
            kids = root.children(recursive=True)
        except psutil.Error:
            kids, root = [], None
        procs = {k.pid: self._procs.get(k.pid, k) for k in kids}
        if root is not None:
            procs[root.pid] = root
        for gone in set(self._procs) - set(procs):
            if gone != self.pid:
                self._retired += self._cpu_seen.pop(gone, 0.0)
        new = [pid for pid in procs if pid not in self._procs and pid != self.pid]
        self._procs = procs
        self._launched = {pid: v for pid, v in self._launched.items() if pid in procs}  # an environment is read once
        self._ranks = ranks_among(procs, self.pid, self._launched)
        for pid in new:  # only CPU used from now on counts: its history would land in one sample as a spike
            self._retired -= self._cpu(pid) or 0.0

    def _cpu(self, pid: int | None) -> float | None:
        """Cumulative user+system seconds of ``pid`` (the last value seen once it has exited)."""
        proc = self._procs.get(pid if pid is not None else -1)
        if proc is None or pid is None:
            return self._cpu_seen.get(pid) if pid is not None else None
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            self._cpu_seen[pid] = t.user + t.system
        return self._cpu_seen.get(pid)


def ranks_among(procs: dict[int, psutil.Process], root: int | None, environ: dict[int, bool] | None = None) -> set[int]:
    """The descendants of ``root`` that are training ranks, not DataLoader workers: a launcher (torchrun,
    accelerate, mpirun) starts each rank with ``LOCAL_RANK`` in its environment, and a rank's workers inherit
    that environment from it, so a rank is a process with ``LOCAL_RANK`` whose parent has none. A watched rank
    itself (``root``) is not counted, and its workers stay workers. ``environ`` caches what each pid's environment
    said (it does not change while the process lives)."""
    environ = {} if environ is None else environ

    def launched(pid: int) -> bool:
        if pid not in environ:
            try:
                environ[pid] = "LOCAL_RANK" in procs[pid].environ() if pid in procs else False
            except psutil.Error:
                environ[pid] = False
        return environ[pid]

    out = set()
    for pid, proc in procs.items():
        if pid == root or not launched(pid):
            continue
        with contextlib.suppress(psutil.Error):
            if not launched(proc.ppid()):
                out.add(pid)
    return out


def _affinity() -> list[int]:
    try:
        return sorted(psutil.Process().cpu_affinity() or [])
    except (AttributeError, psutil.Error):
        return list(range(psutil.cpu_count() or 1))


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie). Command line equivalent: kill -0 PID"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def process_tree(pid: int) -> set[int]:
    """``pid`` and all its descendants (DataLoader workers); just ``pid`` when it cannot be read.

    Command line equivalent: pstree -p PID
    """
    try:
        return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    except psutil.Error:
        return {pid}


def children(pid: int) -> list[tuple[int, tuple[str, ...]]]:
    """``pid``'s direct children with their command lines (none when it cannot be read).

    Command line equivalent: ps -o pid=,args= --ppid PID
    """
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                found.append((child.pid, tuple(child.cmdline())))
    return found


def wait_gone(pids: Iterable[int], timeout_s: float) -> None:
    """Wait until none of ``pids`` exists any more (reaped by whoever holds them), at most ``timeout_s``."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    psutil.wait_procs(procs, timeout=timeout_s)
