"""Run every check against the gathered facts, each isolated: a check that raises is one ``error`` result."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.facts import MachineFacts
from checks.machine import alloc, bench, collective, compat, disk, gpu, nccl_env, network, resources, topology
from checks.probe import LocalProbe, Probe, disk_cache
from checks.result import Phase, Result, Status, timed
from checks.snapshot import dump_snapshot, write_snapshot

Check = Callable[[MachineFacts, PreflightConfig], list[Result]]

# (id, check) in report order. Ids are stable: scripts and docs/checks.md depend on them. A check function may
# return results under more than one id (gpu_bench returns gpu-h2d, gpu-d2h, gpu-d2d, gpu-matmul).
CHECKS: tuple[tuple[str, Check], ...] = (
    ("driver", compat.driver),
    ("gpu-inventory", gpu.gpu_inventory),
    ("torch-build", compat.torch_build),
    ("cuda-compat", compat.cuda_compat),
    ("torch-arch", compat.torch_arch),
    ("torch-libs", compat.torch_libs),
    ("torch-extensions", compat.torch_extensions),
    ("gpu-power", gpu.gpu_power),
    ("gpu-pcie", gpu.gpu_pcie),
    ("gpu-nvlink", gpu.gpu_nvlink),
    ("gpu-throttle", gpu.gpu_throttle),
    ("gpu-ecc", gpu.gpu_ecc),
    ("gpu-mig", gpu.gpu_mig),
    ("gpu-processes", gpu.gpu_processes),
    ("gpu-persistence", gpu.gpu_persistence),
    ("gpu-compute-mode", gpu.gpu_compute_mode),
    ("gpu-topology", topology.gpu_topology),
    ("cpu-cores", resources.cpu_cores),
    ("cpu-governor", resources.cpu_governor),
    ("ram", resources.ram),
    ("shm", resources.shm),
    ("ulimits", resources.ulimits),
    ("nccl-env", nccl_env.nccl_env),
    ("dataloader-advice", resources.dataloader_advice),
    ("gpu-bench", bench.gpu_bench),
    ("gpu-p2p", collective.gpu_p2p),
    ("gpu-allreduce", collective.gpu_allreduce),
    ("disk-mounts", disk.disk_mounts),
    ("disk-speed", disk.disk_speed),
    ("disk-data", disk.disk_data),
    ("disk-checkpoint", disk.disk_checkpoint),
    ("net-download", network.net_download),
    ("alloc-conf", alloc.alloc_conf),
)

# The MachineFacts fields each check reads, so a report can say which gathering phase fed which rows.
# tests/checks/machine/test_runner.py holds it to the checks: a check that reads a field not listed here fails it.
PER_GPU_NVML = ("gpu-power", "gpu-pcie", "gpu-throttle", "gpu-ecc", "gpu-mig", "gpu-processes", "gpu-persistence")
READS: dict[str, tuple[str, ...]] = {
    "driver": ("nvml", "host"),  # host: whether an NVIDIA GPU sits on the PCI bus (a CPU machine by design)
    "gpu-inventory": ("nvml",),
    "torch-build": ("nvml", "torch"),
    "cuda-compat": ("nvml", "torch", "host"),
    "torch-arch": ("nvml", "torch"),
    "torch-libs": ("nvml", "torch"),
    "torch-extensions": ("torch",),
    **dict.fromkeys(PER_GPU_NVML, ("nvml",)),
    "gpu-compute-mode": ("nvml",),
    "gpu-nvlink": ("nvml", "host"),
    "gpu-topology": ("nvml", "host", "topology"),
    "cpu-cores": ("nvml", "host"),
    "cpu-governor": ("host",),
    **dict.fromkeys(("ram", "shm", "ulimits"), ("nvml", "host")),
    "nccl-env": ("nvml", "torch", "host", "topology"),
    "dataloader-advice": ("nvml", "host", "topology"),
    "gpu-bench": ("nvml", "bench"),
    "gpu-p2p": ("nvml", "host", "topology", "p2p"),
    "gpu-allreduce": ("nvml", "host", "topology", "p2p", "allreduce_local"),
    **dict.fromkeys(("disk-mounts", "disk-speed", "disk-data", "disk-checkpoint"), ("disks",)),
    "net-download": ("net",),
    "alloc-conf": ("alloc",),
}
ROWS = {"gpu-bench": ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")}  # the row ids a check reports under


def fed_by(phase: Phase, checks: tuple[tuple[str, Check], ...] = CHECKS) -> Phase:
    """The phase with the row ids of the checks that judge what it gathered (judging phases feed none)."""
    ids = [ROWS.get(c, (c,)) for c, _ in checks if set(READS.get(c, ())) & set(phase.facts)]
    return replace(phase, checks=tuple(i for group in ids for i in group))


def run_check(check_id: str, check: Check, facts: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Run one check; an exception becomes a single ``error`` result naming it."""
    start = time.perf_counter()
    try:
        results = check(facts, cfg)
    except Exception as exc:  # noqa: BLE001 - isolation is the point: one crash must not stop the others
        where = traceback.extract_tb(exc.__traceback__)[-1]
        summary = f"check crashed: {type(exc).__name__}: {exc} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        results = [
            Result(
                check_id,
                Status.ERROR,
                summary,
                hint="a bug in gpu-preflight: please report it with the snapshot (invoke snapshot)",
            )
        ]
    spent = (time.perf_counter() - start) / max(1, len(results))
    return [timed(r, spent) for r in results]


def run_checks(
    facts: MachineFacts, cfg: PreflightConfig, checks: tuple[tuple[str, Check], ...] = CHECKS
) -> list[Result]:
    """Run all checks in order and return their results."""
    results: list[Result] = []
    for check_id, check in checks:
        results += run_check(check_id, check, facts, cfg)
    return results


def measure(probe: Probe, facts: MachineFacts, cfg: PreflightConfig) -> MachineFacts:
    """Run the probe's measurements; a live run keeps its disk figures for stage-data's choice of disk."""
    measured = probe.measure(facts, cfg)
    if probe.live and measured.disks is not None:
        disk_cache.save(measured.disks.locations)
    return measured


@dataclass(frozen=True)
class SnapshotRequest:
    """``invoke snapshot``: record this machine to ``out``; ``bench`` also measures it."""

    config: PreflightConfig
    out: Path
    description: str = ""
    bench: bool = False


def record_snapshot(request: SnapshotRequest) -> MachineFacts:
    """Read this machine's facts (measured too with ``bench``) and write them to the snapshot file."""
    cfg = request.config
    probe = LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s)
    facts = probe.machine()
    if request.bench:
        facts = measure(probe, facts, cfg)
    document = dump_snapshot(facts, recorded=True, description=request.description)
    try:
        write_snapshot(request.out, document)
    except OSError as exc:
        raise PreflightError(f"cannot write snapshot {request.out}: {exc.strerror}") from None
    return facts
