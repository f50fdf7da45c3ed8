"""Read host facts: CPU, memory, cgroup limits, rlimits, /dev/shm, loader path, NVSwitch, container hints.

The only module that reads /proc, /sys, cgroups and psutil for host facts. Every file is read under ``root`` so
tests can point it at a fake tree; a missing, unreadable or odd file gives ``None``, never an exception.
What cannot come from files (affinity, rlimits, the process table) is injectable and, under a fake root,
unknown unless injected.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import TypeVar

import psutil

from checks.facts import HostFacts

# Variables worth recording, by subject. CUDA_VERSION is set by NVIDIA's CUDA images; `container` by
# systemd-nspawn, Podman and LXC.
_CUDA_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_VERSION", "CUDA_MODULE_LOADING")
_LOADER_KEYS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
_TORCH_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK")
# The last three are debugging settings that change what NCCL does when left set (docs/sources.md#nccl-env-vars):
# nccl-env names them.
_NCCL_KEYS = (
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_IGNORE_DISABLED_P2P",
)  # fmt: skip
_JOB_KEYS = ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK")
_THREAD_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_LAUNCH_BLOCKING", "container")
ENV_KEYS: tuple[str, ...] = _CUDA_KEYS + _LOADER_KEYS + _TORCH_KEYS + _NCCL_KEYS + _JOB_KEYS + _THREAD_KEYS

GetRlimit = Callable[[int], tuple[int, int]]
ProcessLister = Callable[[], Iterable[tuple[int, str | None]]]

_T = TypeVar("_T", int, float)

# cgroup v1 says "no limit" with a page-rounded LONG_MAX (9223372036854771712); anything this big is unlimited.
_UNLIMITED_BYTES = 2**60
_CONTAINER_MARKERS = ("docker", "kubepods", "containerd", "lxc", "libpod")
_V1_CPU_MOUNTS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
_FABRIC_MANAGER = "nv-fabricmanager"
# Linux keeps process names (comm) to 15 characters, so without cmdline access psutil reports "nv-fabricmanage".
_FABRIC_MANAGER_NAMES = (_FABRIC_MANAGER, _FABRIC_MANAGER[:15])
_NVIDIA_VENDOR = "0x10de"
_BRIDGE_OTHER_CLASS = "0x0680"  # NVSwitch is a PCI "bridge, other" function: class 0x068000
_GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers: the classes NVIDIA GPUs (data-center ones: 3D) use


def read_host(
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    *,
    affinity: int | None = None,
    getrlimit: GetRlimit | None = None,
    processes: ProcessLister | None = None,
) -> HostFacts:
    """Gather the host facts; ``affinity``, ``getrlimit`` and ``processes`` replace the live readers.

    Under a fake ``root`` the live readers are not used: what is not injected stays unknown.
    """
    env = os.environ if environ is None else environ
    live = root == Path("/")
    allowed: tuple[int, ...] = ()
    if live:
        allowed = _live_cpu_list() if affinity is None else ()
        affinity = affinity if affinity is not None else (len(allowed) or None)
        getrlimit = getrlimit or resource.getrlimit
        processes = processes or _live_processes
    cgroups = _own_cgroups(root)
    meminfo = _meminfo(root)
    shm_total, shm_free = _statvfs(root / "dev" / "shm")
    nofile_soft, nofile_hard = _rlimit(getrlimit, resource.RLIMIT_NOFILE)
    memlock_soft, memlock_hard = _rlimit(getrlimit, resource.RLIMIT_MEMLOCK)
    container = in_container(root, env)
    nvswitches = nvswitch_count(root)
    gpus_on_bus = nvidia_gpu_count(root)
    freq_driver, governors = cpu_governors(root)
    return HostFacts(
        hostname=socket.gethostname() or "unknown",
        kernel=platform.release() or None,
        python=platform.python_version(),
        cpu_model=cpu_model(root),
        cpu_logical=os.cpu_count(),
        cpu_affinity=affinity,
        cpu_allowed=allowed,
        cpu_freq_driver=freq_driver,
        cpu_governors=governors,
        cgroup_cpu_quota=cgroup_cpu_quota(root, cgroups),
        mem_total=meminfo.get("MemTotal"),
        mem_available=meminfo.get("MemAvailable"),
        cgroup_mem_limit=cgroup_mem_limit(root, cgroups),
        shm_total=shm_total,
        shm_free=shm_free,
        nofile_soft=nofile_soft,
        nofile_hard=nofile_hard,
        memlock_soft=memlock_soft,
        memlock_hard=memlock_hard,
        in_container=container,
        cuda_compat_paths=cuda_compat_paths(root, env),
        nvswitch_count=nvswitches,
        nvidia_pci_gpus=gpus_on_bus,
        fabric_manager_running=_fabric_manager(processes, container) if nvswitches else None,
        env={k: env[k] for k in ENV_KEYS if k in env},
    )


def cpu_model(root: Path) -> str | None:
    """Return the CPU's marketing name. Command line equivalent: grep -m1 'model name' /proc/cpuinfo"""
    for line in (_read_text(root / "proc" / "cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None


def cpu_governors(root: Path) -> tuple[str | None, dict[str, int]]:
    """Return the cpufreq scaling driver and how many CPUs run each governor; (None, {}) without cpufreq.

    Most cloud VMs and many containers have no cpufreq folder: the hypervisor sets the clocks.
    Command line equivalent: cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_{driver,governor} | sort | uniq -c
    """
    cpus = root / "sys" / "devices" / "system" / "cpu"
    driver: str | None = None
    governors: dict[str, int] = {}
    for folder in _sorted_glob(cpus, "cpu[0-9]*/cpufreq"):
        governor = (_read_text(folder / "scaling_governor") or "").strip()
        if governor:
            governors[governor] = governors.get(governor, 0) + 1
            driver = driver or (_read_text(folder / "scaling_driver") or "").strip() or None
    return driver, governors


def cgroup_cpu_quota(root: Path, cgroups: Mapping[str, str]) -> float | None:
    """Return the tightest CPU quota in cores along our cgroup path; None: unlimited or unknown.

    Command line equivalent: cat /sys/fs/cgroup/cpu.max (v2), /sys/fs/cgroup/cpu/cpu.cfs_quota_us (v1)
    """
    base = root / "sys" / "fs" / "cgroup"
    found = [_v2_cpu(d) for d in _walk_up(base, cgroups.get("", "/"))]
    for mount in _V1_CPU_MOUNTS:
        found += [_v1_cpu(d) for d in _walk_up(base / mount, cgroups.get("cpu", "/"))]
    return _tightest(found)


def cgroup_mem_limit(root: Path, cgroups: Mapping[str, str]) -> int | None:
    """Return the tightest memory limit in bytes along our cgroup path; None: unlimited or unknown.

    Command line equivalent: cat /sys/fs/cgroup/memory.max (v2), /sys/fs/cgroup/memory/memory.limit_in_bytes (v1)
    """
    base = root / "sys" / "fs" / "cgroup"
    found = [_mem_limit(d / "memory.max") for d in _walk_up(base, cgroups.get("", "/"))]
    found += [_mem_limit(d / "memory.limit_in_bytes") for d in _walk_up(base / "memory", cgroups.get("memory", "/"))]
    return _tightest(found)


def in_container(root: Path, environ: Mapping[str, str]) -> bool:
    """Tell whether we run in a container (Docker, Podman, Kubernetes, LXC, nspawn)."""
    if _exists(root / ".dockerenv") or _exists(root / "run" / ".containerenv") or environ.get("container"):
        return True
    init_cgroup = (_read_text(root / "proc" / "1" / "cgroup") or "").lower()
    return any(marker in init_cgroup for marker in _CONTAINER_MARKERS)


def cuda_compat_paths(root: Path, environ: Mapping[str, str]) -> tuple[str, ...]:
    """List loader-path directories holding a forward-compat libcuda (breaks GeForce: CUDA error 804).

    Searched in loader order: LD_LIBRARY_PATH, then /etc/ld.so.conf, then /etc/ld.so.conf.d/*.conf.
    """
    candidates = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    candidates += _ld_conf_dirs(root / "etc" / "ld.so.conf")
    for conf in _sorted_glob(root / "etc" / "ld.so.conf.d", "*.conf"):
        candidates += _ld_conf_dirs(conf)
    found: dict[str, None] = {}
    for directory in candidates:
        directory = os.path.normpath(directory)
        if _is_compat_dir(directory) and _sorted_glob(root / directory.lstrip("/"), "libcuda.so*"):
            found.setdefault(directory)
    return tuple(found)


def nvidia_gpu_count(root: Path) -> int | None:
    """Count NVIDIA GPU PCI functions (VGA or 3D controller class), driver or not: 0 is a machine without one by
    design (a CPU VM), where a missing driver is no fault; None where the bus cannot be read (no /sys).

    Command line equivalent: lspci -d 10de::0302; lspci -d 10de::0300
    """
    devices = root / "sys" / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return None
    count = 0
    for device in _sorted_glob(devices, "*"):
        vendor = (_read_text(device / "vendor") or "").strip().lower()
        pci_class = (_read_text(device / "class") or "").strip().lower()
        count += vendor == _NVIDIA_VENDOR and pci_class.startswith(_GPU_CLASSES)
    return count


def nvswitch_count(root: Path) -> int:
    """Count NVSwitch PCI functions. Command line equivalent: lspci -d 10de::0680"""
    count = 0
    for device in _sorted_glob(root / "sys" / "bus" / "pci" / "devices", "*"):
        vendor = (_read_text(device / "vendor") or "").strip().lower()
        pci_class = (_read_text(device / "class") or "").strip().lower()
        count += vendor == _NVIDIA_VENDOR and pci_class.startswith(_BRIDGE_OTHER_CLASS)
    return count


def _own_cgroups(root: Path) -> dict[str, str]:
    """Map each controller of /proc/self/cgroup to our path in it; "" is the v2 unified hierarchy."""
    paths: dict[str, str] = {}
    for line in (_read_text(root / "proc" / "self" / "cgroup") or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _walk_up(base: Path, cgroup_path: str) -> list[Path]:
    """Return the cgroup directory for ``cgroup_path`` under ``base`` and each parent up to ``base``."""
    parts = [p for p in PurePosixPath(cgroup_path).parts if p not in ("/", ".", "..")]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_cpu(directory: Path) -> float | None:
    """Read cgroup v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") as cores."""
    fields = (_read_text(directory / "cpu.max") or "").split()
    if not fields or fields[0] == "max":
        return None
    return _cores(_to_int(fields[0]), _to_int(fields[1]) if len(fields) > 1 else 100_000)


def _v1_cpu(directory: Path) -> float | None:
    """Read cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` as cores (quota -1: unlimited)."""
    quota = _to_int(_read_text(directory / "cpu.cfs_quota_us"))
    return _cores(quota, _to_int(_read_text(directory / "cpu.cfs_period_us")))


def _cores(quota: int | None, period: int | None) -> float | None:
    """Turn a CFS quota and period (microseconds) into cores; a missing or non-positive value means no limit."""
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _mem_limit(path: Path) -> int | None:
    """Read a cgroup memory limit file ("max" or a huge value: unlimited)."""
    limit = _to_int(_read_text(path))
    return limit if limit is not None and 0 < limit < _UNLIMITED_BYTES else None


def _meminfo(root: Path) -> dict[str, int]:
    """Parse /proc/meminfo into bytes (the kernel writes kB)."""
    values: dict[str, int] = {}
    for line in (_read_text(root / "proc" / "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        number = _to_int(fields[0]) if fields else None
        if number is not None:
            values[key.strip()] = number * 1024 if fields[1:2] == ["kB"] else number
    return values


def _statvfs(path: Path) -> tuple[int | None, int | None]:
    """Return (total, free) bytes of the filesystem at ``path``. Command line equivalent: df -B1 /dev/shm"""
    try:
        if not path.is_dir():
            return None, None
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail


def _rlimit(getrlimit: GetRlimit | None, which: int) -> tuple[int | None, int | None]:
    """Return (soft, hard) for a resource limit with RLIM_INFINITY as -1. Command line equivalent: ulimit -Sn"""
    if getrlimit is None:
        return None, None
    try:
        soft, hard = getrlimit(which)
    except (OSError, ValueError):
        return None, None
    return _finite_or_minus_one(soft), _finite_or_minus_one(hard)


def _finite_or_minus_one(value: int) -> int:
    """Map RLIM_INFINITY (and any negative value) to -1."""
    return -1 if value == resource.RLIM_INFINITY or value < 0 else value


def _fabric_manager(processes: ProcessLister | None, container: bool) -> bool | None:
    """Tell whether nv-fabricmanager runs; None when we cannot see the process table that would hold it.

    In a container the fabric manager runs on the host, outside our PID namespace, so not seeing it says nothing.
    """
    try:
        seen = list(processes()) if processes else []
    except (psutil.Error, OSError):
        return None
    if any(name in _FABRIC_MANAGER_NAMES for _, name in seen):
        return True
    others = {pid for pid, _ in seen} - {os.getpid()}
    return None if container or not others else False


def _live_processes() -> list[tuple[int, str | None]]:
    """List (pid, name) of the processes we can see; names we may not read are None."""
    return [(p.info["pid"], p.info["name"]) for p in psutil.process_iter(["pid", "name"])]


def _live_cpu_list() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's cpuset). Command line equivalent: taskset -cp $$"""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return ()


def _ld_conf_dirs(conf: Path) -> list[str]:
    """Return the absolute directories listed in an ld.so.conf file (``include`` and ``hwcap`` lines skipped)."""
    dirs: list[str] = []
    for line in (_read_text(conf) or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith(("include", "hwcap")):
            dirs += [d for d in re.split(r"[\s:,=]+", line) if d.startswith("/")]
    return dirs


def _is_compat_dir(directory: str) -> bool:
    """Tell whether a path has a ``compat`` component (cuda-X.Y/compat, or a conda ``cuda-compat`` prefix)."""
    return any(part == "compat" or part.endswith("-compat") for part in PurePosixPath(directory).parts)


def _sorted_glob(directory: Path, pattern: str) -> list[Path]:
    """Return the sorted matches of ``pattern`` in ``directory``; an unreadable directory has none."""
    try:
        return sorted(directory.glob(pattern))
    except OSError:
        return []


def _exists(path: Path) -> bool:
    """Tell whether ``path`` exists; a path we may not look at does not."""
    try:
        return path.exists()
    except OSError:
        return False


def _read_text(path: Path) -> str | None:
    """Return a regular file's text, or None (missing, unreadable, a FIFO that could block)."""
    try:
        return path.read_text(errors="replace") if path.is_file() else None
    except (OSError, ValueError):
        return None


def _to_int(text: str | None) -> int | None:
    """Parse an integer, or None."""
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _tightest(values: Iterable[_T | None]) -> _T | None:
    """Return the smallest known value, or None when none is known."""
    known = [v for v in values if v is not None]
    return min(known) if known else None


def boot_id() -> str | None:
    """This boot's random id (Linux); None where the kernel does not say. Command line: cat /proc/sys/kernel/random/boot_id"""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None
