"""Tests for checks/probe/host.py: fake /proc, /sys and /etc trees under tmp_path, plus one look at this box."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from checks.facts import HostFacts
from checks.probe.host import ENV_KEYS, GetRlimit, ProcessLister, read_host

GIB = 1024**3


def put(root: Path, rel: str, text: str = "") -> Path:
    """Write ``text`` to ``root/rel``, creating the parent directories."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def host(
    root: Path,
    environ: dict[str, str] | None = None,
    *,
    affinity: int | None = None,
    getrlimit: GetRlimit | None = None,
    processes: ProcessLister | None = None,
) -> HostFacts:
    """Read a fake tree with an empty environment unless one is given."""
    return read_host(root, environ or {}, affinity=affinity, getrlimit=getrlimit, processes=processes)


# --- cgroup CPU quota ---------------------------------------------------------------------------------------


def test_cgroup_v2_quota_takes_leaf_when_parent_is_looser(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    put(tmp_path, "sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n")
    put(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n")
    put(tmp_path, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "200000 100000\n")
    assert host(tmp_path).cgroup_cpu_quota == 2.0


def test_cgroup_v2_quota_takes_parent_when_parent_is_tighter(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "0::/slice/job\n")
    put(tmp_path, "sys/fs/cgroup/slice/cpu.max", "150000 100000\n")
    put(tmp_path, "sys/fs/cgroup/slice/job/cpu.max", "800000 100000\n")
    assert host(tmp_path).cgroup_cpu_quota == 1.5


def test_cgroup_v2_max_is_unlimited(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "0::/\n")
    put(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000\n")
    assert host(tmp_path).cgroup_cpu_quota is None


def test_cgroup_v1_quota_over_period(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "4:cpu,cpuacct:/\n3:memory:/\n")
    put(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "350000\n")
    put(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert host(tmp_path).cgroup_cpu_quota == 3.5


def test_cgroup_v1_quota_minus_one_is_unlimited(tmp_path: Path) -> None:
    put(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
    put(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n")
    assert host(tmp_path).cgroup_cpu_quota is None


def test_cgroup_v1_host_path_missing_in_container_mount_falls_back_to_mount_root(tmp_path: Path) -> None:
    # Docker without a cgroup namespace: /proc/self/cgroup names the host path, the mount root is ours.
    put(tmp_path, "proc/self/cgroup", "5:cpu,cpuacct:/docker/0123abcd\n")
    put(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "400000\n")
    put(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n")
    assert host(tmp_path).cgroup_cpu_quota == 4.0


# --- memory -------------------------------------------------------------------------------------------------


def test_cgroup_v2_memory_limit_and_max(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "0::/ctr\n")
    put(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    put(tmp_path, "sys/fs/cgroup/ctr/memory.max", f"{64 * GIB}\n")
    assert host(tmp_path).cgroup_mem_limit == 64 * GIB
    put(tmp_path, "sys/fs/cgroup/ctr/memory.max", "max\n")
    assert host(tmp_path).cgroup_mem_limit is None


def test_cgroup_v1_memory_huge_value_is_unlimited(tmp_path: Path) -> None:
    put(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert host(tmp_path).cgroup_mem_limit is None
    put(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", f"{32 * GIB}\n")
    assert host(tmp_path).cgroup_mem_limit == 32 * GIB


def test_meminfo_kilobytes_become_bytes(tmp_path: Path) -> None:
    put(
        tmp_path,
        "proc/meminfo",
        "MemTotal:       263842124 kB\nMemFree:         1000 kB\nMemAvailable:   250000000 kB\n"
        "HugePages_Total:       0\n",
    )
    facts = host(tmp_path)
    assert facts.mem_total == 263842124 * 1024
    assert facts.mem_available == 250000000 * 1024


def test_cpu_model_from_cpuinfo(tmp_path: Path) -> None:
    put(tmp_path, "proc/cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n")
    assert host(tmp_path).cpu_model == "AMD EPYC 9654"


# --- loader path --------------------------------------------------------------------------------------------


def test_cuda_compat_paths_only_compat_dirs_with_libcuda(tmp_path: Path) -> None:
    put(tmp_path, "usr/local/cuda-12.8/compat/libcuda.so.1")
    put(tmp_path, "usr/local/cuda-12.8/lib64/libcuda.so.1")  # has libcuda, but not a compat directory
    put(tmp_path, "opt/cuda/compat/libcuda.so.570.124.06")
    put(tmp_path, "usr/local/cuda/lib64/libcuda.so")  # not compat
    put(tmp_path, "empty/compat/libcudart.so.12")  # compat, but no libcuda
    put(tmp_path, "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n# /commented/compat\n")
    put(
        tmp_path,
        "etc/ld.so.conf.d/000_cuda.conf",
        "/usr/local/cuda-12.8/compat\n/usr/local/cuda-12.8/lib64\n/opt/cuda/compat\n",
    )
    environ = {"LD_LIBRARY_PATH": "/opt/cuda/compat::/usr/local/cuda/lib64:/empty/compat:/opt/cuda/compat/"}
    facts = host(tmp_path, environ=environ)
    assert facts.cuda_compat_paths == ("/opt/cuda/compat", "/usr/local/cuda-12.8/compat")


def test_cuda_compat_paths_none_without_loader_config(tmp_path: Path) -> None:
    put(tmp_path, "usr/local/cuda-12.8/compat/libcuda.so.1")  # present but not on any loader path
    assert host(tmp_path).cuda_compat_paths == ()


# --- NVSwitch and fabric manager ----------------------------------------------------------------------------


def nvswitch_tree(root: Path) -> None:
    """Two NVSwitch functions, an NVIDIA GPU, a non-NVIDIA bridge and a half-readable device."""
    devices = "sys/bus/pci/devices"
    for bdf in ("0000:05:00.0", "0000:06:00.0"):
        put(root, f"{devices}/{bdf}/vendor", "0x10de\n")
        put(root, f"{devices}/{bdf}/class", "0x068000\n")
    put(root, f"{devices}/0000:18:00.0/vendor", "0x10de\n")
    put(root, f"{devices}/0000:18:00.0/class", "0x030200\n")  # 3D controller: a GPU
    put(root, f"{devices}/0000:40:00.0/vendor", "0x15b3\n")
    put(root, f"{devices}/0000:40:00.0/class", "0x068000\n")
    put(root, f"{devices}/0000:41:00.0/vendor", "0x10de\n")  # no class file


def test_nvswitch_count_skips_gpus_and_other_vendors(tmp_path: Path) -> None:
    nvswitch_tree(tmp_path)
    assert host(tmp_path).nvswitch_count == 2


def test_nvidia_gpus_on_the_bus_are_its_vga_and_3d_functions(tmp_path: Path) -> None:
    """The tree's one 3D controller, plus a VGA one added; NVSwitch bridges and other vendors are not GPUs."""
    nvswitch_tree(tmp_path)
    put(tmp_path, "sys/bus/pci/devices/0000:19:00.0/vendor", "0x10de\n")
    put(tmp_path, "sys/bus/pci/devices/0000:19:00.0/class", "0x030000\n")
    put(tmp_path, "sys/bus/pci/devices/0000:1a:00.0/vendor", "0x1002\n")  # another vendor's GPU
    put(tmp_path, "sys/bus/pci/devices/0000:1a:00.0/class", "0x030000\n")
    assert host(tmp_path).nvidia_pci_gpus == 2


def test_a_bus_without_nvidia_is_zero_and_no_bus_is_unknown(tmp_path: Path) -> None:
    put(tmp_path, "sys/bus/pci/devices/0000:00:01.0/vendor", "0x8086\n")
    put(tmp_path, "sys/bus/pci/devices/0000:00:01.0/class", "0x060000\n")
    assert host(tmp_path).nvidia_pci_gpus == 0
    assert host(tmp_path / "elsewhere").nvidia_pci_gpus is None


@pytest.mark.parametrize(
    ("processes", "expected"),
    [
        ([(1, "systemd"), (2210, "nv-fabricmanager")], True),
        ([(1, "systemd"), (2210, "nv-fabricmanage")], True),  # comm truncated to 15 characters
        ([(1, "systemd"), (77, "bash"), (78, None)], False),
        ([], None),  # process table unreadable
        ([(os.getpid(), "python")], None),  # only ourselves: cannot tell
    ],
)
def test_fabric_manager_from_process_table(
    tmp_path: Path, processes: list[tuple[int, str | None]], expected: bool | None
) -> None:
    nvswitch_tree(tmp_path)
    assert host(tmp_path, processes=lambda: processes).fabric_manager_running is expected


def test_fabric_manager_not_seen_in_container_is_unknown(tmp_path: Path) -> None:
    nvswitch_tree(tmp_path)
    put(tmp_path, ".dockerenv")
    facts = host(tmp_path, processes=lambda: [(1, "sleep"), (9, "bash")])
    assert facts.fabric_manager_running is None


def test_fabric_manager_not_asked_without_nvswitch(tmp_path: Path) -> None:
    def must_not_run() -> list[tuple[int, str | None]]:
        raise AssertionError("process table read without NVSwitch")

    assert host(tmp_path, processes=must_not_run).fabric_manager_running is None


def test_fabric_manager_lister_failure_is_unknown(tmp_path: Path) -> None:
    nvswitch_tree(tmp_path)

    def broken() -> list[tuple[int, str | None]]:
        raise PermissionError("no /proc")

    assert host(tmp_path, processes=broken).fabric_manager_running is None


# --- container, limits, shm, env ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "text", "environ"),
    [
        (".dockerenv", "", {}),
        ("run/.containerenv", "", {}),
        ("proc/1/cgroup", "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab.scope\n", {}),
        ("proc/1/cgroup", "12:cpu,cpuacct:/lxc/web\n", {}),
        ("unrelated", "", {"container": "podman"}),
    ],
)
def test_in_container_markers(tmp_path: Path, rel: str, text: str, environ: dict[str, str]) -> None:
    put(tmp_path, rel, text)
    assert host(tmp_path, environ=environ).in_container is True


def test_not_in_container_on_plain_host_tree(tmp_path: Path) -> None:
    put(tmp_path, "proc/1/cgroup", "0::/init.scope\n")
    assert host(tmp_path).in_container is False


def test_injected_rlimits_map_infinity_to_minus_one(tmp_path: Path) -> None:
    limits = {
        resource.RLIMIT_NOFILE: (1024, 1048576),
        resource.RLIMIT_MEMLOCK: (65536, resource.RLIM_INFINITY),
    }
    facts = host(tmp_path, getrlimit=lambda which: limits[which], affinity=3)
    assert (facts.nofile_soft, facts.nofile_hard) == (1024, 1048576)
    assert (facts.memlock_soft, facts.memlock_hard) == (65536, -1)
    assert facts.cpu_affinity == 3


def test_shm_from_statvfs(tmp_path: Path) -> None:
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    facts = host(tmp_path)
    assert facts.shm_total is not None and facts.shm_total > 0
    assert facts.shm_free is not None and 0 <= facts.shm_free <= facts.shm_total


def test_env_keeps_only_listed_keys() -> None:
    assert {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PYTORCH_ALLOC_CONF", "NCCL_P2P_DISABLE"} <= set(ENV_KEYS)
    environ = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_DISABLE": "1", "HOME": "/root", "HF_TOKEN": "secret"}
    facts = read_host(Path("/nonexistent-root"), environ)
    assert facts.env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_DISABLE": "1"}


# --- missing and odd files ----------------------------------------------------------------------------------


def test_empty_tree_gives_unknowns_not_errors(tmp_path: Path) -> None:
    facts = host(tmp_path)
    assert facts.cpu_model is None and facts.cpu_affinity is None
    assert facts.cgroup_cpu_quota is None and facts.cgroup_mem_limit is None
    assert facts.mem_total is None and facts.mem_available is None
    assert facts.shm_total is None and facts.shm_free is None
    assert facts.nofile_soft is None and facts.memlock_hard is None  # live limits are not read under a fake root
    assert facts.in_container is False and facts.cuda_compat_paths == ()
    assert facts.nvswitch_count == 0 and facts.fabric_manager_running is None and facts.env == {}


def test_odd_files_give_unknowns_not_errors(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "garbage without colons\n0::/../../escape\n")
    put(tmp_path, "sys/fs/cgroup/cpu.max", "lots 100000\n")
    put(tmp_path, "sys/fs/cgroup/escape/cpu.max", "100000 0\n")
    (tmp_path / "sys/fs/cgroup/memory.max").mkdir(parents=True)  # a directory where a file should be
    put(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "")
    put(tmp_path, "proc/meminfo", "MemTotal: lots kB\nnonsense\n")
    put(tmp_path, "proc/cpuinfo", "model name\t:\n")
    put(tmp_path, "sys/bus/pci/devices/0000:05:00.0/class", "0x068000\n")
    (tmp_path / "sys/bus/pci/devices/0000:05:00.0/vendor").write_bytes(b"\xff\xfe\x00")
    facts = host(tmp_path)
    assert facts.cgroup_cpu_quota is None and facts.cgroup_mem_limit is None
    assert facts.mem_total is None and facts.cpu_model is None and facts.nvswitch_count == 0


def test_fifo_does_not_block(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    os.mkfifo(tmp_path / "proc" / "meminfo")
    assert host(tmp_path).mem_total is None


# --- this machine -------------------------------------------------------------------------------------------


def test_read_host_on_this_machine() -> None:
    facts = read_host()
    assert facts.hostname and facts.hostname != "unknown"
    assert facts.cpu_affinity is not None and facts.cpu_affinity >= 1
    assert facts.cpu_logical is not None and facts.cpu_affinity <= facts.cpu_logical
    assert facts.mem_total is not None and facts.mem_total > 0
    assert facts.mem_available is not None and 0 < facts.mem_available <= facts.mem_total
    assert facts.nofile_soft is not None and (facts.nofile_soft == -1 or facts.nofile_soft >= 1)
    assert facts.python is not None and facts.python.count(".") == 2
    assert facts.cgroup_cpu_quota is None or facts.cgroup_cpu_quota > 0


def test_cpu_governors_counted_per_cpu_with_the_driver(tmp_path: Path) -> None:
    cpus = "sys/devices/system/cpu"
    for n, governor in enumerate(["powersave", "powersave", "performance"]):
        put(tmp_path, f"{cpus}/cpu{n}/cpufreq/scaling_governor", governor + "\n")
        put(tmp_path, f"{cpus}/cpu{n}/cpufreq/scaling_driver", "acpi-cpufreq\n")
    (tmp_path / cpus / "cpu3").mkdir()  # an offline CPU has no cpufreq folder
    put(tmp_path, f"{cpus}/cpufreq/policy0/scaling_governor", "powersave\n")  # policy folders are not CPUs
    facts = host(tmp_path)
    assert facts.cpu_freq_driver == "acpi-cpufreq"
    assert facts.cpu_governors == {"powersave": 2, "performance": 1}
    assert host(tmp_path / "empty").cpu_governors == {}
