"""Facts about a machine, as the probe gathers them: frozen records, no behaviour.

Every field a query can fail to answer is optional: ``None`` means "not supported / not readable here",
never zero. Units follow NVML (bytes, milliwatts, MHz) so a recorded snapshot is the raw truth; checks
convert for display. These records are also the machine snapshot format (see ``checks/snapshot.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from checks.result import Report


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (host PID: it may not resolve inside a container)."""

    pid: int
    used_memory: int | None = None  # bytes; None under WDDM or when hidden
    name: str | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Row-remapper state (Ampere and newer): ``nvmlDeviceGetRemappedRows``."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML sees it. ``error`` is set when the GPU stopped answering (lost, fallen off the bus)."""

    index: int
    name: str
    uuid: str | None = None
    bus_id: str | None = None
    pci_device_id: int | None = None  # 0xDDDD10DE: device id in the high 16 bits
    brand: str | None = None  # "geforce", "geforce-rtx", "nvidia", "tesla", "quadro", ... (lower-cased NVML brand)
    compute_capability: tuple[int, int] | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes, includes the driver's reservation on v1
    memory_reserved: int | None = None  # bytes, driver reservation (v2 only)
    power_limit_mw: int | None = None
    power_default_limit_mw: int | None = None
    power_enforced_limit_mw: int | None = None
    power_max_limit_mw: int | None = None
    power_usage_mw: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # device AND system (slot) maximum
    pcie_gen_gpu_max: int | None = None  # the GPU's own maximum
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None  # device AND system maximum
    pcie_gen_loaded: int | None = None  # sampled while a host-to-device copy ran; None: not measured
    pcie_width_loaded: int | None = None
    nvlink_total: int | None = None  # links that exist; None: no NVLink / not supported
    nvlink_active: int | None = None
    clock_event_reasons: int | None = None  # bit mask, see checks/machine/gpu.py
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    slowdown_temp_c: int | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    ecc_corrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    mig_devices: int | None = None
    persistence_mode: bool | None = None
    compute_mode: int | None = None  # 0 default, 2 prohibited, 3 exclusive-process
    processes: tuple[GpuProcess, ...] | None = None  # None: the query is not supported
    query_errors: tuple[str, ...] = ()  # "function: message" for queries that failed unexpectedly (field left None)
    error: str | None = None  # the GPU stopped answering altogether (lost, needs a reset)


@dataclass(frozen=True)
class NvmlFacts:
    """Driver-level facts. ``error`` is the reason NVML could not be used at all (then ``gpus`` is empty)."""

    error: str | None = None
    error_kind: str | None = None  # library-not-found, driver-not-loaded, version-mismatch, no-permission, other
    driver_version: str | None = None  # "570.124.06"
    cuda_driver_version: int | None = None  # 12080 means CUDA 12.8
    gpus: tuple[GpuFacts, ...] = ()


@dataclass(frozen=True)
class ExtensionFacts:
    """A torch extension package (torchvision, torchaudio) and whether its compiled ops load against this torch.

    ``version`` is None when the package is not installed. ``error`` is what importing it or calling one of its
    compiled ops raised (``RuntimeError: operator torchvision::nms does not exist`` for a CUDA torchvision beside a
    CPU torch); None when the op ran. ``op`` names what was called.
    """

    name: str
    version: str | None = None
    op: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class TorchFacts:
    """The torch build in this Python environment, probed in a subprocess.

    ``error`` is set when torch is missing (``error_kind="missing"``), fails to import, or the probe timed
    out (``"timeout"``). ``cuda_init_error`` is the text CUDA initialisation produced, e.g. error 802/804.
    """

    error: str | None = None
    error_kind: str | None = None  # missing, import-error, timeout, crashed
    version: str | None = None
    cuda: str | None = None  # torch.version.cuda, e.g. "12.8"; None on CPU and ROCm builds
    hip: str | None = None
    arch_list: tuple[str, ...] = ()
    cudnn_version: int | None = None  # 91002 for 9.10.2
    cudnn_compiled_version: str | None = None  # "9.10.2"
    nccl_version: str | None = None  # "2.27.3"
    cuda_available: bool = False
    device_count: int = 0
    cuda_init_error: str | None = None
    requires: tuple[str, ...] = ()  # Requires-Dist pins of the torch distribution (nvidia-* packages)
    installed_libs: dict[str, str] = field(default_factory=dict)  # installed nvidia-* distributions -> version
    # torchvision and torchaudio, installed or not; None: not probed (a snapshot older than the field)
    extensions: tuple[ExtensionFacts, ...] | None = None


@dataclass(frozen=True)
class HostFacts:
    """CPU, memory, limits and loader environment of the host (or container)."""

    hostname: str = "unknown"
    kernel: str | None = None
    python: str | None = None
    cpu_model: str | None = None
    cpu_logical: int | None = None  # os.cpu_count(): what the host has, not what we may use
    cpu_affinity: int | None = None  # CPUs in this process's affinity mask
    cpu_allowed: tuple[int, ...] = ()  # which CPUs they are (empty: not recorded, a snapshot older than the field)
    cpu_freq_driver: str | None = None  # cpufreq scaling driver (intel_pstate, acpi-cpufreq...); None: no cpufreq
    cpu_governors: dict[str, int] = field(default_factory=dict)  # scaling governor -> how many CPUs use it
    cgroup_cpu_quota: float | None = None  # cores allowed by cpu.max / cfs_quota; None: unlimited
    mem_total: int | None = None  # bytes
    mem_available: int | None = None
    cgroup_mem_limit: int | None = None  # bytes; None: unlimited
    shm_total: int | None = None  # /dev/shm size in bytes; None: missing
    shm_free: int | None = None
    nofile_soft: int | None = None  # -1 means unlimited
    nofile_hard: int | None = None
    memlock_soft: int | None = None  # bytes, -1 unlimited
    memlock_hard: int | None = None
    in_container: bool = False
    cuda_compat_paths: tuple[str, ...] = ()  # directories with a forward-compat libcuda on the loader path
    nvswitch_count: int = 0  # NVSwitch PCI functions on this host
    nvidia_pci_gpus: int | None = None  # NVIDIA GPUs on the PCI bus, driver or not; None: not read (older snapshots)
    fabric_manager_running: bool | None = None  # None: cannot tell (no process table access)
    env: dict[str, str] = field(default_factory=dict)  # relevant variables only (see checks/probe/host.py ENV_KEYS)

    @property
    def usable_cores(self) -> float:
        """Cores this process may really use: the affinity mask and the cgroup quota, not os.cpu_count().

        The one formula for bootstrap, stage-data, verify and watch. A fractional quota stays fractional (1.5 cores
        is 1.5); callers that need a count of processes use ``process_slots``.
        """
        candidates = [c for c in (self.cpu_affinity, self.cgroup_cpu_quota, self.cpu_logical) if c]
        return float(min(candidates)) if candidates else 1.0

    @property
    def process_slots(self) -> int:
        """How many CPU-bound processes to run: the usable cores rounded up (a 1.5-core quota still runs 2)."""
        return max(1, math.ceil(self.usable_cores))


@dataclass(frozen=True)
class GpuBench:
    """Micro-benchmark figures for one GPU (CUDA events after warm-up, median of repeats)."""

    index: int
    h2d_gb_s: float | None = None  # pinned host -> device
    d2h_gb_s: float | None = None  # device -> pinned host
    d2d_gb_s: float | None = None  # device copy, counted as bytes read + bytes written
    matmul_tflops: float | None = None
    matmul_dtype: str | None = None  # "bfloat16", "float16" or "float32"
    error: str | None = None
    uuid: str | None = None  # as torch reports it; joins the CUDA index to NVML's (the orders can differ)


@dataclass(frozen=True)
class BenchFacts:
    """The GPU micro-benchmarks, or why they did not run."""

    gpus: tuple[GpuBench, ...] = ()
    skipped: str | None = None
    recorded: bool = False  # replayed from a snapshot rather than measured now


@dataclass(frozen=True)
class AllocFacts:
    """What a fresh login-shell Python process saw of the allocator configuration."""

    wanted: str  # the value the provision step wrote
    variable: str  # PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF
    env_seen: str | None = None  # the variable's value inside the fresh process
    torch_settings: str | None = None  # torch's own parsed allocator settings, when readable
    source: str | None = None  # how torch_settings was read: "accelerator-api", "cuda-snapshot"
    error: str | None = None  # torch rejected the value, or the process failed
    skipped: str | None = None
    applied: bool = True  # False: preflight.alloc_conf.apply is off, the user's own setting is judged


@dataclass(frozen=True)
class MachineFacts:
    """Everything the checks judge; one snapshot file holds exactly this."""

    nvml: NvmlFacts
    torch: TorchFacts
    host: HostFacts
    bench: BenchFacts | None = None
    alloc: AllocFacts | None = None
    disks: DiskFacts | None = None  # mounts and measured locations (bootstrap's disk measurements)
    net: NetFacts | None = None  # downloads from configured URLs
    topology: TopologyFacts | None = None  # GPU-to-GPU paths, NUMA, interfaces; None in older snapshots
    p2p: P2PFacts | None = None  # measured device-to-device copy bandwidth per GPU pair
    allreduce_local: LocalAllreduceFacts | None = None  # NCCL all-reduce over this box's GPUs
    env: EnvFacts | None = None  # OS, toolkit, packages, variables (checks/probe/env.py); None in older snapshots


# --- disks and network (records of checks/probe/disk.py, checks/probe/net.py and the fleet) --------------------


@dataclass(frozen=True)
class MountFacts:
    """One mounted filesystem that matters for data or checkpoints (pseudo filesystems are left out)."""

    mountpoint: str
    fs_type: str
    source: str | None = None  # device, or server:/export for network filesystems
    kind: str = "local"  # local | network | fuse | overlay | memory
    read_only: bool = False
    total_bytes: int | None = None
    free_bytes: int | None = None  # available to unprivileged users (statvfs f_bavail)
    inodes_total: int | None = None  # None or 0: the filesystem has no fixed inode table
    inodes_free: int | None = None
    error: str | None = None  # statvfs failed, or hung (a dead network mount)


@dataclass(frozen=True)
class LocationFacts:
    """One candidate place for data or checkpoints, measured with test files that are removed afterwards.

    MB is 1e6 bytes. ``None`` figures were not measured (``error`` says why when it is not the budget).
    """

    path: str
    explicit: bool = False  # listed in disk.locations rather than found
    mountpoint: str | None = None
    fs_type: str | None = None
    kind: str | None = None  # as MountFacts.kind
    free_bytes: int | None = None
    file_bytes: int | None = None  # size of the sequential test file
    seq_write_mb_s: float | None = None  # data fsynced to the device
    cold_read_mb_s: float | None = None  # the file's page cache dropped first
    cold_read_method: str | None = None  # fadvise | o_direct | warm (cache could not be dropped: an upper bound)
    small_files_per_s: float | None = None  # ~100 KB files opened and read, cache dropped, several readers
    small_file_bytes: int | None = None
    small_files: int | None = None
    checkpoint_bytes: int | None = None
    checkpoint_write_s: float | None = None  # one file of checkpoint_bytes written and fsynced
    checkpoint_estimated: bool = False  # extrapolated from the sequential write: the full file did not fit the budget
    tool: str = "builtin"  # fio | builtin: what measured the sequential figures
    error: str | None = None
    seconds: float | None = None  # time spent on this location
    stale_removed: tuple[str, ...] = ()  # scratch directories a killed earlier run left here, removed first
    stale_removed_bytes: int = 0  # what they held


@dataclass(frozen=True)
class DiskFacts:
    """The mounts, and the measured candidate locations (or why they were not measured)."""

    mounts: tuple[MountFacts, ...] = ()
    locations: tuple[LocationFacts, ...] = ()
    skipped: str | None = None
    recorded: bool = False  # replayed from a snapshot rather than measured now


@dataclass(frozen=True)
class DownloadFacts:
    """One bounded, streamed download from a configured URL. ``url`` and ``error`` are redacted."""

    url: str
    mb_s: float | None = None
    latency_ms: float | None = None  # request sent -> response headers received
    bytes: int = 0
    seconds: float | None = None
    status: int | None = None  # HTTP status
    error: str | None = None


@dataclass(frozen=True)
class NetFacts:
    """Network measurements of one host: downloads from the configured URLs."""

    downloads: tuple[DownloadFacts, ...] = ()
    skipped: str | None = None
    recorded: bool = False


@dataclass(frozen=True)
class LinkFacts:
    """TCP from ``src`` to ``dst`` (host names as given): throughput at the receiver, and round-trip time."""

    src: str
    dst: str
    tcp_mbit_s: float | None = None  # Mbit = 1e6 bits
    rtt_ms: float | None = None  # median of TCP ping-pongs on an idle connection
    tool: str = "builtin"  # iperf3 | builtin: what measured the throughput
    streams: int = 1
    seconds: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class AllreduceFacts:
    """One message size of the all-reduce sweep across hosts (GB = 1e9 bytes)."""

    backend: str  # nccl | gloo
    world_size: int
    bytes: int
    algbw_gb_s: float
    busbw_gb_s: float  # algbw x 2(n-1)/n
    seconds: float | None = None  # median time of one all-reduce
    iterations: int = 0


@dataclass(frozen=True)
class HostOutcome:
    """One host of a fleet run: its report, or the reason it has none."""

    name: str
    status: str  # ok | fail
    reason: str | None
    report: Report | None
    seconds: float
    exit_code: int | None = None
    shipped: str | None = None  # rsync | tar
    installed: str | None = None  # --install: where the dependencies are and what was put there


@dataclass(frozen=True)
class FleetFacts:
    """Everything a fleet run gathered."""

    hosts: tuple[HostOutcome, ...]
    links: tuple[LinkFacts, ...] = ()
    links_skipped: str | None = None
    allreduce: tuple[AllreduceFacts, ...] = ()
    allreduce_reason: str | None = None  # "skipped: ..." or "failed ..."
    source: str = "--hosts"


# --- the software environment (checks/probe/env.py; judged by checks/env/) ------------------------------------


@dataclass(frozen=True)
class EnvFacts:
    """The software a training run depends on beyond torch: OS, toolkit, CPU features, packages, variables.

    ``packages`` maps normalized distribution names (PEP 503: lower case, runs of ``-_.`` as ``-``) to versions.
    ``variables`` hold the behaviour-changing environment variables, secrets redacted to ``<redacted>``.
    """

    os_name: str | None = None  # PRETTY_NAME of /etc/os-release, e.g. "Ubuntu 22.04.5 LTS"
    os_id: str | None = None  # ID and VERSION_ID, e.g. "ubuntu 22.04"
    glibc: str | None = None  # "2.35"; None on musl or when unknown
    kernel: str | None = None
    arch: str | None = None  # platform.machine(): x86_64, aarch64
    cpu_model: str | None = None
    cpu_flags: tuple[str, ...] = ()  # the flags that change kernels: avx2, avx512*, amx*, bf16 variants
    python: str | None = None  # "3.11.9"
    python_executable: str | None = None
    nvcc_version: str | None = None  # "12.8" from `nvcc --version`; None: no toolkit found
    nvcc_path: str | None = None
    nvcc_error: str | None = None  # nvcc found but did not answer (timeout, crash)
    cuda_home: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)


# --- GPU to GPU inside one box (read by checks/probe/nvml.py read_topology, judged by checks/machine/topology.py)


@dataclass(frozen=True)
class GpuLocality:
    """Where one GPU sits: its NUMA node, the CPUs local to it, and where its active NVLinks end."""

    index: int
    bus_id: str | None = None
    numa_node: int | None = None  # None: the firmware gives none (single socket, many VMs) or not readable
    cpus: tuple[int, ...] = ()  # CPUs local to the GPU (nvmlDeviceGetCpuAffinity); empty: not answered
    nvlink_peers: tuple[str, ...] = ()  # remote PCI bus id of each active NVLink that ends at another GPU
    nvlink_switch_links: int = 0  # active NVLinks that end at an NVSwitch (HGX/DGX baseboards)


@dataclass(frozen=True)
class GpuPair:
    """Two GPUs (NVML indices, a < b): the common PCIe ancestor, NVLinks between them and NVML's P2P status.

    P2P status letters are ``nvidia-smi topo -p2p``'s: OK, CNS (chipset not supported), GNS (GPU not
    supported), TNS (topology not supported), DR (disabled by regkey), NS (not supported), U (unknown).
    """

    a: int
    b: int
    level: int | None = None  # nvmlDeviceGetTopologyCommonAncestor: 0, 10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS
    nvlinks: int = 0  # NV#: links joining the pair directly, or through NVSwitches (the fewer of the two GPUs')
    p2p_read: str | None = None
    p2p_write: str | None = None
    p2p_atomics: str | None = None
    p2p_nvlink: str | None = None


@dataclass(frozen=True)
class TopologyFacts:
    """The box's GPU topology and the host's network interfaces (for NCCL_SOCKET_IFNAME)."""

    gpus: tuple[GpuLocality, ...] = ()
    pairs: tuple[GpuPair, ...] = ()
    interfaces: tuple[str, ...] | None = None  # None: not read
    error: str | None = None  # NVML could not be used


@dataclass(frozen=True)
class P2PBandwidth:
    """Device-to-device copy from ``src`` to ``dst`` (NVML indices), GB/s (1e9), median of repeats."""

    src: int
    dst: int
    gb_s: float | None = None
    peer_access: bool | None = None  # torch.cuda.can_device_access_peer: False means staged through host memory
    error: str | None = None


@dataclass(frozen=True)
class P2PFacts:
    """The copy-bandwidth matrix of checks/probe/scripts/p2p_bench.py, or why it did not run."""

    pairs: tuple[P2PBandwidth, ...] = ()
    mib: int | None = None  # copy size
    skipped: str | None = None
    recorded: bool = False


@dataclass(frozen=True)
class LocalAllreduceFacts:
    """All-reduce over this box's GPUs, one process per GPU (checks/probe/scripts/allreduce.py), or why not."""

    rows: tuple[AllreduceFacts, ...] = ()
    skipped: str | None = None
    error: str | None = None  # the run failed: the child's last words
    recorded: bool = False
