"""The hardware seam: the only way checks learn about a machine.

``LocalProbe`` reads the live machine through the adapters (``nvml``: NVML; ``torch``: torch in a child process
with a timeout; ``host``: /proc, /sys, cgroups, psutil; ``mounts``, ``disk``, ``net``: filesystems, disks and
downloads). ``sample`` is the cheap reader verify and watch poll ten times a second. The package is the only code
that imports pynvml or psutil, or reads /proc, /sys and the mount table; measuring never writes anything the user
keeps (the caller decides what to keep, e.g. ``disk_cache``). ``SnapshotProbe`` replays a
recorded machine from a snapshot file, so every line above this seam runs in tests without a GPU.

``LocalProbe`` times each step on its ``clock`` (``checks.result.Stopwatch``), bootstrap's own time. Reading facts
overlaps: the torch child imports torch while a thread reads the host, the environment and the topology (NVML is
read before the child starts, so it never sees it). Measurements run alone: a torch import beside the disk
measurement costs the disk figures (BENCHMARKS.md#bootstrap), and the benchmarks need the GPUs to themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from checks.config import PreflightConfig
from checks.facts import (
    AllocFacts,
    BenchFacts,
    DiskFacts,
    EnvFacts,
    HostFacts,
    LocalAllreduceFacts,
    MachineFacts,
    NetFacts,
    P2PFacts,
    TopologyFacts,
)
from checks.probe.collective import measure_collective, read_box_topology
from checks.probe.disk import measure_disks
from checks.probe.env import read_env
from checks.probe.host import read_host
from checks.probe.net import measure_downloads
from checks.probe.nvml import PcieLinkSampler, read_nvml, uuid_key
from checks.probe.torch import read_alloc, read_torch, run_bench
from checks.result import Stopwatch
from checks.snapshot import load_snapshot

Stamp = tuple[str, tuple[str, ...], float, float]  # a phase timed in another thread: name, facts, began, ended
T = TypeVar("T")


class Probe(Protocol):
    """Where facts come from: the live machine or a snapshot."""

    live: bool
    label: str  # "live" or the snapshot's file name

    def machine(self) -> MachineFacts:
        """Driver, GPU, torch and host facts (cheap: seconds)."""
        ...

    def measure(self, facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
        """Run the GPU micro-benchmarks (reading PCIe links under load), the disk and download measurements."""
        ...

    def alloc(self, wanted: str, variables: tuple[str, ...], cfg: PreflightConfig) -> AllocFacts:
        """Read the allocator settings back from a fresh login shell."""
        ...


class LocalProbe:
    """The machine this process runs on."""

    live = True
    label = "live"

    def __init__(
        self, torch_timeout_s: float = 60.0, nvcc_timeout_s: float = 10.0, clock: Stopwatch | None = None
    ) -> None:
        self.torch_timeout_s = torch_timeout_s
        self.nvcc_timeout_s = nvcc_timeout_s
        self.clock = clock or Stopwatch()

    def machine(self) -> MachineFacts:
        with self.clock.phase("NVML", ("nvml",)):
            nvml = read_nvml()
        with ThreadPoolExecutor(1, thread_name_prefix="gpu-preflight-probe") as pool:
            rest = pool.submit(self._host_env_topology)
            with self.clock.phase("torch probe", ("torch",)):  # waited on here, so Ctrl-C stops the child
                torch = read_torch(timeout=self.torch_timeout_s)
            (host, env, topology), stamps = rest.result()
        for name, facts, began, ended in stamps:
            self.clock.add(name, began, ended, facts)
        return MachineFacts(nvml=nvml, torch=torch, host=host, env=env, topology=topology)

    def _host_env_topology(self) -> tuple[tuple[HostFacts, EnvFacts, TopologyFacts], list[Stamp]]:
        """The host, environment and topology reads, each stamped (run beside the torch child)."""
        stamps: list[Stamp] = []

        def stamped(name: str, facts: str, read: Callable[[], T]) -> T:
            began = self.clock.now()
            value = read()
            stamps.append((name, (facts,), began, self.clock.now()))
            return value

        host = stamped("host", "host", read_host)
        env = stamped("environment", "env", lambda: read_env(nvcc_timeout_s=self.nvcc_timeout_s))
        return (host, env, stamped("topology", "topology", read_box_topology)), stamps

    def measure(self, facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
        facts = _disks_and_net(facts, cfg, self.clock)
        with self.clock.phase("p2p and all-reduce", ("p2p", "allreduce_local")):
            facts = measure_collective(facts, cfg)  # p2p matrix, local all-reduce
        reason = _bench_precondition(facts, cfg)
        if reason:
            return dataclasses.replace(facts, bench=BenchFacts(skipped=reason))
        settings = {k: getattr(cfg.bench, k) for k in ("copy_mib", "d2d_mib", "matmul_n", "warmup", "repeats")}
        with self.clock.phase("GPU benchmarks", ("bench",)), PcieLinkSampler() as sampler:
            bench = _align_to_nvml(run_bench(settings, cfg.bench.timeout_s, while_running=sampler.sample), facts)
            peak = sampler.peak()
        gpus = tuple(
            dataclasses.replace(g, pcie_gen_loaded=peak[g.index][0], pcie_width_loaded=peak[g.index][1])
            if g.index in peak
            else g
            for g in facts.nvml.gpus
        )
        return dataclasses.replace(facts, bench=bench, nvml=dataclasses.replace(facts.nvml, gpus=gpus))

    def alloc(self, wanted: str, variables: tuple[str, ...], cfg: PreflightConfig) -> AllocFacts:
        return read_alloc(wanted, variables, cfg.probe.alloc_timeout_s)


def _disks_and_net(facts: MachineFacts, cfg: PreflightConfig, clock: Stopwatch) -> MachineFacts:
    """Disks (checks/probe/disk.py) and downloads (checks/probe/net.py); each bounded by its config budget."""
    net = cfg.network
    with clock.phase("downloads", ("net",)):
        downloads = measure_downloads(net.download_urls, net.download_max_mib, net.download_timeout_s)
    with clock.phase("disks", ("disks",)):
        disks = measure_disks(cfg.disk)
    return dataclasses.replace(facts, disks=disks, net=downloads)


def _align_to_nvml(bench: BenchFacts, facts: MachineFacts) -> BenchFacts:
    """Renumber benchmark rows from CUDA indices to NVML indices by UUID (docs/sources.md#nvml-cuda-index).

    Without a UUID (torch < 2.1) the child ran with CUDA_DEVICE_ORDER=PCI_BUS_ID, which is NVML's order as
    long as CUDA_VISIBLE_DEVICES does not hide GPUs.
    """
    by_uuid = {uuid_key(g.uuid): g.index for g in facts.nvml.gpus if g.uuid}
    rows = tuple(
        dataclasses.replace(row, index=by_uuid[uuid_key(row.uuid)])
        if row.uuid and uuid_key(row.uuid) in by_uuid
        else row
        for row in bench.gpus
    )
    return dataclasses.replace(bench, gpus=rows)


def _bench_precondition(facts: MachineFacts, cfg: PreflightConfig) -> str | None:
    if not cfg.bench.enabled:
        return "disabled (preflight.bench.enabled: false, or --no-bench)"
    if facts.nvml.error or not facts.nvml.gpus:
        return "no NVIDIA GPU visible (see driver)"
    if not facts.torch.cuda_available:
        return "torch cannot use CUDA here (see torch-build and cuda-compat)"
    return None


class SnapshotProbe:
    """A recorded machine, replayed. Measurements it does not hold are skipped with that reason."""

    live = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.facts, self.header = load_snapshot(path)
        self.label = f"snapshot {path.name}" + (" (recorded)" if self.header.get("recorded") else "")

    def machine(self) -> MachineFacts:
        return dataclasses.replace(
            self.facts, bench=None, alloc=None, disks=None, net=None, p2p=None, allreduce_local=None
        )

    def measure(self, facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
        recorded = self.facts.bench
        if not cfg.bench.enabled:
            bench = BenchFacts(skipped="disabled (preflight.bench.enabled: false, or --no-bench)")
        elif recorded is None:
            bench = BenchFacts(skipped="replayed snapshot: GPU micro-benchmarks need the live machine")
        else:
            bench = dataclasses.replace(recorded, recorded=True)
        measured = dataclasses.replace(facts, bench=bench, disks=self._disks(), net=self._net())
        return self._collective(measured, cfg)

    def _collective(self, facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
        """The recorded p2p matrix and local all-reduce (replayed as recorded), or why there are none."""
        why = "disabled (preflight.bench.enabled: false, or --no-bench)" if not cfg.bench.enabled else None
        p2p, allreduce = self.facts.p2p, self.facts.allreduce_local
        return dataclasses.replace(
            facts,
            p2p=P2PFacts(skipped=why) if why or p2p is None else dataclasses.replace(p2p, recorded=True),
            allreduce_local=LocalAllreduceFacts(skipped=why)
            if why or allreduce is None
            else dataclasses.replace(allreduce, recorded=True),
        )

    def _disks(self) -> DiskFacts:
        if self.facts.disks is None:
            return DiskFacts(skipped="replayed snapshot: disk measurements need the live machine")
        return dataclasses.replace(self.facts.disks, recorded=True)

    def _net(self) -> NetFacts:
        if self.facts.net is None:
            return NetFacts(skipped="replayed snapshot: downloads need the live machine")
        return dataclasses.replace(self.facts.net, recorded=True)

    def alloc(self, wanted: str, variables: tuple[str, ...], cfg: PreflightConfig) -> AllocFacts:
        if self.facts.alloc is not None:
            return self.facts.alloc
        return AllocFacts(
            wanted=wanted,
            variable=variables[0],
            skipped="replayed snapshot: the allocator read-back needs the live machine",
        )
