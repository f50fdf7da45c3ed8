"""CPU, RAM, shared memory and limits per GPU, and the DataLoader settings that follow from them.

The seed article's most common hidden bottleneck: a cheap box with 2 vCPUs per GPU decoding JPEGs, or a
container with Docker's 64 MB /dev/shm. Thresholds are config keys under ``preflight.host`` with sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.grading import grade, graded
from checks.machine.topology import numa_reason
from checks.result import Result, Status, fail, ok, warn
from checks.units import GIB, MIB


def _gpu_count(m: MachineFacts) -> int:
    return sum(1 for g in m.nvml.gpus if g.error is None) if not m.nvml.error else 0


def _limit_source(m: MachineFacts, cores: float) -> str:
    h = m.host
    if h.cgroup_cpu_quota and h.cgroup_cpu_quota <= cores:
        return f"cgroup quota {h.cgroup_cpu_quota:g} of {h.cpu_logical} host CPUs"
    if h.cpu_affinity and h.cpu_logical and h.cpu_affinity < h.cpu_logical:
        return f"affinity {h.cpu_affinity} of {h.cpu_logical} host CPUs"
    return f"{h.cpu_logical} CPUs"


def cpu_cores(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Enough usable CPU cores per GPU to feed it (affinity and cgroup quota count, not the host total).

    Command line equivalent: nproc; cat /sys/fs/cgroup/cpu.max
    """
    cores, gpus = m.host.usable_cores, _gpu_count(m)
    src = _limit_source(m, cores)
    if gpus == 0:
        return [ok("cpu-cores", f"{cores:g} usable cores ({src}); no GPU to feed", value=cores)]
    per = cores / gpus
    summary = f"{per:.1f} usable cores per GPU ({cores:g} cores: {src}; {gpus} GPU(s))"
    kw = {"value": round(per, 2), "expected": f">= {cfg.host.cores_per_gpu_warn:g} per GPU"}
    hint = (
        "too few cores to decode and augment data for the GPU: pick an offer with more vCPUs per GPU, or "
        "pre-decode the dataset once into fixed-size uint8 arrays on local disk so workers only copy them"
    )
    status = grade(per, cfg.host.cores_per_gpu_warn, cfg.host.cores_per_gpu_fail)
    return [graded("cpu-cores", status, summary, hint, **kw)]


def _ram_bytes(m: MachineFacts) -> int | None:
    values = [v for v in (m.host.mem_total, m.host.cgroup_mem_limit) if v]
    return min(values) if values else None


def ram(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Host RAM (or the container's memory limit) per GPU is at least that GPU's memory.

    Command line equivalent: free -g; cat /sys/fs/cgroup/memory.max
    """
    total, gpus = _ram_bytes(m), [g for g in m.nvml.gpus if g.error is None and g.memory_total]
    if total is None:
        return [warn("ram", "memory size not readable", "check `free -g`")]
    limited = " (container limit)" if m.host.cgroup_mem_limit and m.host.cgroup_mem_limit == total else ""
    if not gpus:
        return [ok("ram", f"{total / GIB:.0f} GiB RAM{limited}", value=round(total / GIB, 1))]
    per = total / len(gpus)
    need = cfg.host.ram_per_gpu_min_ratio * max(g.memory_total or 0 for g in gpus)
    summary = f"{per / GIB:.0f} GiB RAM per GPU{limited} for {need / GIB / cfg.host.ram_per_gpu_min_ratio:.0f} GiB GPUs"
    kw = {"value": round(per / GIB, 1), "expected": f">= {need / GIB:.0f} GiB per GPU"}
    hint = "loading checkpoints and worker prefetch need host RAM: expect swapping or OOM kills; pick an offer with more RAM"
    return [graded("ram", grade(per, need), summary, hint, **kw)]


@dataclass(frozen=True)
class LoaderAdvice:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "prefetch_factor": self.prefetch_factor,
        }


def _cpu_workers(m: MachineFacts, cfg: PreflightConfig) -> tuple[float, int]:
    """Cores per GPU, and the workers per GPU they can run (before any shared-memory limit)."""
    per = m.host.usable_cores / max(1, _gpu_count(m))
    dl = cfg.dataloader
    return per, max(0, min(dl.max_workers, math.floor(per) - dl.reserve_cores))


def loader_advice(m: MachineFacts, cfg: PreflightConfig) -> LoaderAdvice:
    """Recommended DataLoader settings per training process (one process per GPU)."""
    gpus, dl = max(1, _gpu_count(m)), cfg.dataloader
    per, workers = _cpu_workers(m, cfg)
    reasons = [
        f"{per:.1f} cores per GPU - {dl.reserve_cores} for the training process -> {workers} worker{'' if workers == 1 else 's'}"
    ]
    if workers == dl.max_workers:
        reasons.append(f"capped at {dl.max_workers} (more workers contend for memory bandwidth)")
    shm = m.host.shm_total
    if shm is not None and workers:
        fit = int(shm / gpus // (cfg.host.shm_per_worker_mib * MIB))
        if fit < workers:
            workers = max(0, fit)
            reasons.append(f"/dev/shm {shm / MIB:.0f} MiB holds {fit} workers' batches per GPU")
    has_gpu = _gpu_count(m) > 0
    reasons.append("pin_memory for async host-to-GPU copies" if has_gpu else "no GPU: pin_memory off")
    return LoaderAdvice(workers, has_gpu, workers > 0, dl.prefetch_factor if workers else None, tuple(reasons))


def shm(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """/dev/shm holds what the DataLoader workers pass to the training process.

    Command line equivalent: df -h /dev/shm
    """
    size = m.host.shm_total
    if size is None:
        return [
            fail(
                "shm",
                "/dev/shm is missing",
                "DataLoader workers need it: mount tmpfs on /dev/shm (docker run --shm-size=16g)",
            )
        ]
    gpus = max(1, _gpu_count(m))
    wanted_workers = _cpu_workers(m, cfg)[1]
    need = max(cfg.host.shm_min_mib * MIB, wanted_workers * gpus * cfg.host.shm_per_worker_mib * MIB)
    per = f" x {gpus} GPU(s)" if _gpu_count(m) else ""
    summary = f"/dev/shm {size / MIB:.0f} MiB for {wanted_workers} worker(s){per}"
    kw = {"value": round(size / MIB), "expected": f">= {need / MIB:.0f} MiB"}
    hint = f"docker run --shm-size={math.ceil(need / GIB)}g (or remount /dev/shm larger); too small ends in 'Bus error' in workers"
    status = grade(size, need, cfg.host.shm_min_mib * MIB)  # need is at least shm_min_mib
    why = {Status.FAIL: ": DataLoader workers will die with 'Bus error'", Status.WARN: ": fewer workers fit"}
    return [graded("shm", status, summary + why.get(status, ""), hint, **kw)]


def _nofile_hint(hard: int | None, soft: int, wanted: int) -> str:
    if hard == -1 or (hard is not None and hard > soft):
        target = "unlimited" if hard == -1 else str(hard)
        return f"`ulimit -n {target}` in the training shell ('Too many open files' with many workers)"
    return (
        f"the hard limit is {hard}: raise it as root (docker run --ulimit nofile={wanted}:{wanted}, "
        "or /etc/security/limits.conf) to avoid 'Too many open files' with many workers"
    )


def ulimits(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Open-file and locked-memory limits fit DataLoader workers and NCCL.

    Command line equivalent: ulimit -n; ulimit -l
    """
    h, problems, hints = m.host, [], []
    if h.nofile_soft is not None and h.nofile_soft != -1 and h.nofile_soft < cfg.host.nofile_min:
        problems.append(f"open files {h.nofile_soft} < {cfg.host.nofile_min}")
        hints.append(_nofile_hint(h.nofile_hard, h.nofile_soft, cfg.host.nofile_min))
    memlock_min = int(cfg.host.memlock_min_gib * GIB)
    if _gpu_count(m) > 1 and h.memlock_soft is not None and h.memlock_soft != -1 and h.memlock_soft < memlock_min:
        problems.append(f"locked memory {h.memlock_soft / MIB:.0f} MiB < {cfg.host.memlock_min_gib:g} GiB")
        hints.append("`ulimit -l unlimited` (RDMA / NCCL over InfiniBand need it)")
    value = {"nofile": h.nofile_soft, "memlock": h.memlock_soft}
    if problems:
        return [warn("ulimits", "; ".join(problems), "; ".join(hints), value=value)]
    lock = "unlimited" if h.memlock_soft == -1 else f"{(h.memlock_soft or 0) / MIB:.0f} MiB"
    return [ok("ulimits", f"open files {h.nofile_soft}, locked memory {lock}", value=value)]


# cpufreq drivers whose own "powersave" policy still scales the clock with load; under every other driver the
# generic powersave governor holds the lowest clock (docs/sources.md#cpu-governor).
DYNAMIC_POWERSAVE_DRIVERS = ("intel_pstate", "amd-pstate-epp")


def cpu_governor(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """No CPU held at its lowest clock by the cpufreq powersave governor (data loading runs on these cores).

    Command line equivalent: cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_{driver,governor} | sort | uniq -c
    """
    h = m.host
    if not h.cpu_governors:
        return [ok("cpu-governor", "cpufreq not exposed here (a VM or container: the host sets the clocks)")]
    driver = h.cpu_freq_driver or "unknown driver"
    total = sum(h.cpu_governors.values())
    seen = ", ".join(f"{n} {name}" for name, n in sorted(h.cpu_governors.items(), key=lambda kv: -kv[1]))
    value = {"driver": h.cpu_freq_driver, "governors": dict(h.cpu_governors)}
    slow = h.cpu_governors.get("powersave", 0)
    if slow and h.cpu_freq_driver not in DYNAMIC_POWERSAVE_DRIVERS:
        summary = f"{slow} of {total} CPUs on the powersave governor ({driver}): they run at their lowest clock"
        hint = (
            "JPEG decoding and augmentation in DataLoader workers slow down with the clock (an estimate: not "
            "measured here): `sudo cpupower frequency-set -g performance` (or write performance to "
            "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor); without root, ask the provider"
        )
        return [warn("cpu-governor", summary, hint, value=value)]
    note = " (this driver's powersave still scales with load)" if slow else ""
    return [ok("cpu-governor", f"cpufreq {driver}: {seen}{note}", value=value)]


# Measured (BENCHMARKS.md, "staged loader"): workers only slow a memory-mapped read down, since every batch a
# worker makes is copied into fresh shared memory; staged_loader reads whole batches in a thread instead.
STAGED_ADVICE = (
    "a stage-data folder needs no workers: staged_loader(root, batch_size, device=...) from templates/staged_dataset.py"
)


def dataloader_advice(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Recommend num_workers, pin_memory, persistent_workers and prefetch_factor for this box."""
    a = loader_advice(m, cfg)
    settings = ", ".join(f"{k}={v}" for k, v in a.as_dict().items())
    numa = numa_reason(m)  # several NUMA nodes: where each rank's workers belong
    summary = f"DataLoader({settings}) for data decoded as it is read (JPEG files): " + "; ".join(a.reasons)
    summary += (f"; {numa}" if numa else "") + f"; {STAGED_ADVICE}"
    if a.num_workers == 0 and _gpu_count(m) > 0:
        hint = (
            "no core to spare for workers: loading runs inside the training loop; pre-decode the data once with "
            "`invoke stage-data` and read it with staged_loader, which needs no workers"
        )
        return [warn("dataloader-advice", summary, hint, value=a.as_dict())]
    return [ok("dataloader-advice", summary, value=a.as_dict())]
