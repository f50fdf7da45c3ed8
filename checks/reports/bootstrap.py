"""The ``measurements`` of bootstrap's JSON report as typed records: one definition for its writer
(``checks.machine.measurements`` builds ``BootstrapMeasurements``) and its readers (``invoke diff``, the fleet of
``bootstrap --hosts`` and of a Slurm job: its outliers, drift table and all-reduce plan, and the node records the
job's exchange carries). Standard library and the core only.

``BootstrapMeasurements.to_json`` is the one place the keys are written (docs/formats.md lists them) and
``from_json`` the one place they are read: every block is a record whose fields are all required, so a block with a
key missing, renamed or of the wrong type is refused with a ``ContractError`` naming the path
(``report.json.measurements.inventory: ... missing 1 required ... argument: 'cuda'``), never half-read. The blocks
bootstrap writes only when it measured them (``gpu_bench``, ``topology``, ``disks`` ...) are None when absent, and so
is ``environment`` in a report written before it existed (``invoke diff`` then says what it cannot compare).
``read_measurements`` turns a refusal into the one-line ``PreflightError`` a reader of a file shows.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from checks.errors import PreflightError
from checks.result import Report
from checks.typedjson import ContractError, Record

T = TypeVar("T")


@dataclass(frozen=True)
class Dataloader(Record):
    """``measurements.dataloader``: the recommended DataLoader settings (``checks.machine.resources.LoaderAdvice``)."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None


@dataclass(frozen=True)
class GpuBenchRow(Record):
    """``measurements.gpu_bench[]``: one GPU's micro-benchmark figures (``checks.facts.GpuBench``; GB = 1e9 bytes)."""

    index: int
    h2d_gb_s: float | None
    d2h_gb_s: float | None
    d2d_gb_s: float | None
    matmul_tflops: float | None
    matmul_dtype: str | None
    error: str | None
    uuid: str | None


@dataclass(frozen=True)
class PcieLink(Record):
    """``measurements.pcie_under_load.gpuN``: the highest PCIe generation and width seen under load."""

    gen: int
    width: int | None


@dataclass(frozen=True)
class TopologyGpu(Record):
    """``measurements.topology.gpus[]``: a GPU's NUMA node and its local CPUs as a cpulist (``0-31``)."""

    index: int
    numa_node: int | None
    cpus: str


@dataclass(frozen=True)
class TopologyPair(Record):
    """``measurements.topology.pairs[]``: a GPU pair's path as ``nvidia-smi topo -m`` names it, and NVML's P2P
    status letters."""

    a: int
    b: int
    path: str
    p2p_read: str | None
    p2p_write: str | None
    p2p_atomics: str | None


@dataclass(frozen=True)
class Topology(Record):
    """``measurements.topology``: with two or more GPUs whose paths were read."""

    gpus: tuple[TopologyGpu, ...]
    pairs: tuple[TopologyPair, ...]


@dataclass(frozen=True)
class P2pPair(Record):
    """``measurements.p2p.pairs[]``: one direction's copy bandwidth against what its path carries."""

    src: int
    dst: int
    gb_s: float | None
    peer_access: bool | None
    line_rate_gb_s: float | None
    path: str
    error: str | None


@dataclass(frozen=True)
class P2p(Record):
    """``measurements.p2p``: the GPU-to-GPU copies (``mib`` the copy size)."""

    mib: int | None
    pairs: tuple[P2pPair, ...]


@dataclass(frozen=True)
class AllreduceRow(Record):
    """One message size of an all-reduce (``measurements.allreduce_local.rows[]``; ``checks.facts.AllreduceFacts``)."""

    backend: str
    world_size: int
    bytes: int
    algbw_gb_s: float
    busbw_gb_s: float
    seconds: float | None
    iterations: int


@dataclass(frozen=True)
class LocalAllreduce(Record):
    """``measurements.allreduce_local``: the box's all-reduce sweep and the busbw expected of it (and why)."""

    rows: tuple[AllreduceRow, ...]
    expected_busbw_gb_s: float | None
    basis: str


@dataclass(frozen=True)
class DiskRow(Record):
    """``measurements.disks[]``: one measured location (MB = 1e6 bytes; ``local``: a local block device)."""

    path: str
    fs_type: str | None
    local: bool
    free_bytes: int | None
    seq_write_mb_s: float | None
    cold_read_mb_s: float | None
    small_files_per_s: float | None
    checkpoint_write_s: float | None
    tool: str
    kind: str | None
    cold_read_method: str | None
    file_bytes: int | None
    checkpoint_bytes: int | None
    checkpoint_estimated: bool
    error: str | None
    stale_removed: tuple[str, ...]
    stale_removed_bytes: int


@dataclass(frozen=True)
class Mount(Record):
    """``measurements.mounts[]``: one mounted filesystem (``checks.facts.MountFacts``)."""

    mountpoint: str
    fs_type: str
    source: str | None
    kind: str
    read_only: bool
    total_bytes: int | None
    free_bytes: int | None
    inodes_total: int | None
    inodes_free: int | None
    error: str | None


@dataclass(frozen=True)
class Download(Record):
    """``measurements.downloads[]``: one configured URL's download (``url`` and ``error`` redacted)."""

    url: str
    mb_s: float | None
    latency_ms: float | None
    bytes: int
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Inventory(Record):
    """``measurements.inventory``: what a fleet needs of each host (its all-reduce backend, the GPU models)."""

    gpus: int
    gpu_names: tuple[str, ...]
    torch: str | None
    cuda: bool  # torch can use CUDA
    nccl: str | None


@dataclass(frozen=True)
class Environment(Record):
    """``measurements.environment``: the software a run depends on, read by ``invoke diff`` and the fleet's drift
    table; ``summary`` is the ``environment:`` line under the report's header, ``packages`` every installed
    distribution (name -> version). A None field was not readable."""

    COMPARED: ClassVar[tuple[str, ...]] = (
        "os", "glibc", "python", "torch", "torch_cuda", "nccl", "cudnn", "driver", "driver_cuda", "nvcc"
    )  # fmt: skip
    summary: str
    os: str | None
    glibc: str | None
    python: str | None
    torch: str | None
    torch_cuda: str | None
    nccl: str | None
    cudnn: str | None
    driver: str | None
    driver_cuda: str | None
    nvcc: str | None
    packages: dict[str, str]

    def value(self, name: str) -> str | None:
        """One of the ``COMPARED`` fields, or ``package:NAME``'s version (None: not installed)."""
        if name.startswith("package:"):
            return self.packages.get(name.removeprefix("package:"))
        if name not in self.COMPARED:
            raise KeyError(name)
        return typing.cast("str | None", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class BootstrapMeasurements(Record):
    """``measurements`` of bootstrap's JSON report; its fields in the order ``to_json`` writes them.

    Always: ``dataloader`` and ``inventory`` (and ``environment``, which reports written before it lack). When
    measured or recorded: the rest, left out of the JSON when None (``disks`` and ``mounts`` together).
    """

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"gpu_bench", "pcie_under_load", "topology", "p2p", "allreduce_local", "alloc_conf_changes"}
        | {"disks", "mounts", "downloads", "environment"}
    )
    dataloader: Dataloader
    gpu_bench: tuple[GpuBenchRow, ...] | None = None
    pcie_under_load: dict[str, PcieLink] | None = None  # by GPU: gpu0, gpu1 ...
    topology: Topology | None = None
    p2p: P2p | None = None
    allreduce_local: LocalAllreduce | None = None
    alloc_conf_changes: tuple[str, ...] | None = None  # lines written, or the unified diffs (--dry-run)
    disks: tuple[DiskRow, ...] | None = None
    mounts: tuple[Mount, ...] | None = None
    downloads: tuple[Download, ...] | None = None
    inventory: Inventory
    environment: Environment | None = None  # None: a report written before the environment block


def row_of(cls: type[T], facts: object) -> T:
    """The record ``cls`` with the same-named fields of ``facts`` (a facts record the row copies whole)."""
    return cls(**{f.name: getattr(facts, f.name) for f in fields(typing.cast(Any, cls))})


def read_measurements(report: Report, source: str) -> BootstrapMeasurements:
    """The typed measurements of the bootstrap report read from ``source`` (a file, a host's report); a report whose
    measurements are not bootstrap's, or miss or misname a key, is a one-line ``PreflightError`` naming ``source``."""
    data: Any = report.measurements
    if isinstance(data, Mapping) and "run" in data and "inventory" not in data:
        raise PreflightError(
            f"{source} is a verify report, not bootstrap's", hint="give an invoke bootstrap --json report"
        )
    try:
        return BootstrapMeasurements.from_json(data, f"{source}.measurements")
    except ContractError as exc:
        raise PreflightError(
            str(exc), hint="give a bootstrap --json report of this gpu-preflight: rerun invoke bootstrap --json"
        ) from None
