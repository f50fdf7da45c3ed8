"""GPU to GPU inside one box: the path between every pair, P2P, NUMA placement.

Paths are named as ``nvidia-smi topo -m`` names them (docs/sources.md#nvml-topology): NV# for # NVLinks,
else the common PCIe ancestor: PIX (one PCIe switch), PXB (several switches), PHB (a CPU host bridge), NODE (host
bridges of one NUMA node), SYS (across the CPU interconnect, UPI/QPI). Verdicts: a pair the card and box should
join by NVLink but do not, P2P not available where it should be, and GPUs split across sockets.
"""

from __future__ import annotations

from collections.abc import Iterable

from checks.config import PreflightConfig
from checks.facts import GpuFacts, GpuLocality, GpuPair, MachineFacts, TopologyFacts
from checks.reports.bootstrap import Topology, TopologyGpu, TopologyPair
from checks.result import Result, Status, fail, ok, skip, warn
from checks.tables.datasheet import form_factor

LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_P2P_OK = "OK"


def path_name(pair: GpuPair) -> str:
    """``NV18``, ``PIX`` ... ``SYS``; ``?`` when NVML did not answer."""
    if pair.nvlinks:
        return f"NV{pair.nvlinks}"
    return LEVELS.get(pair.level, "?") if pair.level is not None else "?"


def p2p_ok(pair: GpuPair) -> bool | None:
    """Both read and write P2P are OK (NCCL drops P2P unless both are: docs/sources.md#nvml-topology); None when NVML did not say."""
    if pair.p2p_read is None and pair.p2p_write is None:
        return None
    return pair.p2p_read == _P2P_OK and pair.p2p_write == _P2P_OK


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-47,96-143``: a CPU set as Linux cpulists write it."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def gpu_list(indices: Iterable[int]) -> str:
    """``gpu0-3,6``."""
    return "gpu" + cpu_list(indices)


def answering(m: MachineFacts) -> list[GpuFacts]:
    return [g for g in m.nvml.gpus if g.error is None] if not m.nvml.error else []


def pair_of(topo: TopologyFacts, a: int, b: int) -> GpuPair | None:
    lo, hi = min(a, b), max(a, b)
    return next((p for p in topo.pairs if p.a == lo and p.b == hi), None)


def matrix(topo: TopologyFacts) -> list[str]:
    """The ``nvidia-smi topo -m`` table: a path per pair, each GPU's local CPUs and NUMA node."""
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    cells = [[f"GPU{g.index}" for g in gpus]]
    for g in gpus:
        row = [
            "X" if h.index == g.index else path_name(p) if (p := pair_of(topo, g.index, h.index)) else "?" for h in gpus
        ]
        cells.append(row)
    width = max(len(c) for row in cells for c in row) + 1
    head = " " * 6 + "".join(f"{c:<{width}}" for c in cells[0]) + "CPU Affinity  NUMA"
    lines = [head.rstrip()]
    for g, row in zip(gpus, cells[1:], strict=True):
        numa = "N/A" if g.numa_node is None else str(g.numa_node)
        lines.append(
            f"{'GPU' + str(g.index):<6}"
            + "".join(f"{c:<{width}}" for c in row)
            + f"{cpu_list(g.cpus) or 'N/A':<14}{numa}"
        )
    return lines


def numa_groups(topo: TopologyFacts) -> list[tuple[int | None, list[GpuLocality]]]:
    """GPUs grouped by NUMA node, in node order (None last)."""
    nodes: dict[int | None, list[GpuLocality]] = {}
    for g in sorted(topo.gpus, key=lambda g: g.index):
        nodes.setdefault(g.numa_node, []).append(g)
    return sorted(nodes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))


def _expects_nvlink(m: MachineFacts) -> bool:
    """SXM modules (or an NVSwitch baseboard) join every pair by NVLink; PCIe boards only through optional bridges."""
    return any(form_factor(g, m.host.nvswitch_count).sxm for g in answering(m))


def _geforce(m: MachineFacts) -> bool:
    return all((g.brand or "").startswith("geforce") for g in answering(m))


def _missing_nvlink(m: MachineFacts, topo: TopologyFacts) -> list[Result]:
    if not _expects_nvlink(m):
        return []
    bare = [p for p in topo.pairs if not p.nvlinks]
    if not bare:
        return []
    named = ", ".join(f"gpu{p.a}-gpu{p.b} {path_name(p)}" for p in bare[:4]) + (" ..." if len(bare) > 4 else "")
    hint = (
        "an SXM box joins every GPU pair by NVLink: `nvidia-smi nvlink --status` and `nvidia-smi topo -m` show which "
        "links are down; a reboot brings hidden links back on some cloud images (Azure/azhpc-images#443), else ask the "
        "provider for another box (all-reduce over PCIe is ~10-20x slower)"
    )
    return [fail("gpu-topology", f"{len(bare)} pair(s) without NVLink: {named}", hint)]


def _p2p_problems(m: MachineFacts, topo: TopologyFacts) -> list[Result]:
    """P2P missing where it should work; on GeForce missing P2P is expected and an OK suggests a patched driver."""
    if _geforce(m):
        granted = [p for p in topo.pairs if p2p_ok(p)]
        if not granted:
            return []
        hint = "P2P on GeForce comes from a patched driver and can hang NCCL (NVIDIA/nccl-tests#117): if all-reduce hangs, set NCCL_P2P_DISABLE=1"
        return [
            warn("gpu-topology", f"P2P reported OK on GeForce cards ({len(granted)} pair(s)): a patched driver", hint)
        ]
    out: list[Result] = []
    nvlink_off = [p for p in topo.pairs if p.nvlinks and p2p_ok(p) is False]
    if nvlink_off:
        pair = nvlink_off[0]
        hint = "NCCL stops with an error on an NVLink path without P2P (docs/sources.md#nvml-topology): check the driver and fabric manager; never set NCCL_IGNORE_DISABLED_P2P"
        out.append(
            fail(
                "gpu-topology",
                f"P2P {pair.p2p_read} on NVLink pair gpu{pair.a}-gpu{pair.b} ({len(nvlink_off)} pair(s))",
                hint,
            )
        )
    pcie_off = [p for p in topo.pairs if not p.nvlinks and path_name(p) in ("PIX", "PXB") and p2p_ok(p) is False]
    if pcie_off:
        pair = pcie_off[0]
        why = (
            "disabled by the driver (regkey)"
            if "DR" in (pair.p2p_read, pair.p2p_write)
            else f"status {pair.p2p_read}/{pair.p2p_write}"
        )
        hint = "GPUs behind one PCIe switch should copy directly: ACS or the IOMMU may redirect peer traffic (`lspci -vvv | grep ACSCtl`); ask the provider"
        out.append(
            warn(
                "gpu-topology",
                f"no P2P between gpu{pair.a}-gpu{pair.b} under one PCIe switch ({why}; {len(pcie_off)} pair(s))",
                hint,
            )
        )
    return out


def _split_sockets(topo: TopologyFacts) -> list[Result]:
    sys_pairs = [p for p in topo.pairs if not p.nvlinks and p.level == 50]
    if not sys_pairs:
        return []
    groups = "; ".join(f"NUMA {node}: {gpu_list(g.index for g in gs)}" for node, gs in numa_groups(topo))
    hint = (
        "traffic between the sockets crosses UPI/QPI (NCCL models it at 10-40 GB/s) and P2P stops at the host bridge: "
        "keep one job on one socket's GPUs (CUDA_VISIBLE_DEVICES), or rent a box whose GPUs share NVLink or a PCIe switch"
    )
    return [warn("gpu-topology", f"GPUs split across sockets ({groups}): {len(sys_pairs)} pair(s) SYS", hint)]


def _headline(m: MachineFacts, topo: TopologyFacts) -> str:
    paths: dict[str, int] = {}
    for p in topo.pairs:
        paths[path_name(p)] = paths.get(path_name(p), 0) + 1
    kinds = ", ".join(f"{name} x{n}" for name, n in sorted(paths.items()))
    if len(paths) == 1:
        kinds = f"{next(iter(paths))} every pair"
    states = {p.p2p_read for p in topo.pairs} | {p.p2p_write for p in topo.pairs}
    p2p = "P2P OK" if states == {_P2P_OK} else "P2P " + "/".join(sorted(s or "?" for s in states))
    if _geforce(m) and _P2P_OK not in states:
        p2p += " (GeForce: no P2P, NCCL goes through host shared memory)"
    return f"{len(topo.gpus)} GPUs: {kinds}; {p2p}"


def gpu_topology(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """The path between every GPU pair (NVLink, PCIe switch, host bridge, socket), P2P and NUMA placement.

    Command line equivalent: nvidia-smi topo -m; nvidia-smi topo -p2p rw
    """
    if len(answering(m)) < 2:
        return [skip("gpu-topology", "fewer than two GPUs: no GPU pairs")]
    topo = m.topology
    if topo is None:
        return [skip("gpu-topology", "not recorded (a snapshot older than the topology section)")]
    if topo.error or not topo.pairs:
        return [skip("gpu-topology", f"NVML gave no topology: {topo.error or 'no GPU pairs answered'}")]
    cpuset = cpuset_outside_gpus(m)
    problems = _missing_nvlink(m, topo) + _p2p_problems(m, topo) + _split_sockets(topo) + ([cpuset] if cpuset else [])
    table = "\n".join(matrix(topo))
    value = {f"{p.a}-{p.b}": path_name(p) for p in topo.pairs}
    if not problems:
        return [ok("gpu-topology", f"{_headline(m, topo)}\n{table}", value=value)]
    worst = Status.FAIL if any(r.status is Status.FAIL for r in problems) else Status.WARN
    summary = "; ".join(r.summary for r in problems) + f"\n{table}"
    hint = " | ".join(r.hint or "" for r in problems)
    make = fail if worst is Status.FAIL else warn
    return [make("gpu-topology", summary, hint, value=value)]


def numa_reason(m: MachineFacts) -> str | None:
    """The CPUs local to each GPU and how to pin each rank's DataLoader workers there; None on one NUMA node.

    Only CPUs this process may use are named (a container's cpuset): GPUs whose local CPUs all lie outside it are
    said so, and their ranks are pointed at the allowed CPUs instead of a node they cannot run on."""
    topo = m.topology
    if topo is None or len(topo.gpus) < 2:
        return None
    groups = numa_groups(topo)
    if len(groups) < 2 or any(node is None for node, _ in groups):
        return None
    allowed = set(m.host.cpu_allowed)
    parts, outside = [], []
    for node, gs in groups:
        local = [c for g in gs[:1] for c in g.cpus]
        usable = [c for c in local if c in allowed] if allowed else local
        if allowed and local and not usable:
            outside.append((node, gs))
            continue
        parts.append(f"{gpu_list(g.index for g in gs)} -> CPUs {cpu_list(usable) or '?'} (NUMA {node})")
    text = (
        f"NUMA: {'; '.join(parts)}: pin each rank's process and workers to its GPU's CPUs "
        "(`numactl --physcpubind=CPUS --membind=N` per rank, or os.sched_setaffinity in worker_init_fn)"
        if parts
        else "NUMA: no GPU's local CPUs are allowed here"
    )
    for node, gs in outside:
        text += (
            f"; {gpu_list(g.index for g in gs)} (NUMA {node}) have no local CPU this container may use: "
            f"their ranks run on CPUs {cpu_list(allowed)} across the socket link"
        )
    return text


def cpuset_outside_gpus(m: MachineFacts) -> Result | None:
    """A warning when the process's allowed CPUs leave out the NUMA node of some GPUs (a container's cpuset)."""
    topo, allowed = m.topology, set(m.host.cpu_allowed)
    if topo is None or not allowed:
        return None
    cut = [g for g in topo.gpus if g.cpus and not allowed & set(g.cpus)]
    if not cut:
        return None
    nodes = sorted({g.numa_node for g in cut if g.numa_node is not None})
    where = f"NUMA {', '.join(map(str, nodes))}" if nodes else "their local CPUs"
    summary = (
        f"this process may run on CPUs {cpu_list(allowed)} only, none of them local to "
        f"{gpu_list(g.index for g in cut)} ({where}): their ranks' workers and copies cross the socket link"
    )
    hint = (
        f"ask for a cpuset that covers the GPUs' nodes (docker run --cpuset-cpus={cpu_list(c for g in topo.gpus for c in g.cpus)}), "
        f"or use only {gpu_list(g.index for g in topo.gpus if allowed & set(g.cpus))} (CUDA_VISIBLE_DEVICES)"
    )
    return warn("gpu-topology", summary, hint)


def topology_measurements(m: MachineFacts) -> Topology | None:
    """``measurements.topology``: each GPU's NUMA node and CPUs, and each pair's path and P2P status."""
    topo = m.topology
    if topo is None or not topo.pairs:
        return None
    return Topology(
        gpus=tuple(TopologyGpu(g.index, g.numa_node, cpu_list(g.cpus)) for g in topo.gpus),
        pairs=tuple(TopologyPair(p.a, p.b, path_name(p), p.p2p_read, p.p2p_write, p.p2p_atomics) for p in topo.pairs),
    )
