"""Measured GPU-to-GPU bandwidth inside one box: the p2p copy matrix and the local all-reduce.

A pair's copy bandwidth is judged against its path's line rate: NVLinks x 25 GB/s per direction (50 on NVLink 5,
compute capability 10 and newer), or the slower card's PCIe x16 rate; without peer access the copy goes through
host memory and crosses the link twice, so half that [derived] (docs/sources.md#pcie-p2p-host). The
all-reduce's peak busbw is judged against ``templates/nccl.yaml`` for the card and the box's path.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import Any

import yaml

from checks.config import PreflightConfig, TopologyConfig
from checks.facts import GpuFacts, MachineFacts, P2PBandwidth
from checks.machine.grading import grade, graded
from checks.machine.nccl_env import broken_socket
from checks.machine.topology import answering, p2p_ok, pair_of, path_name
from checks.reports.bootstrap import AllreduceRow, LocalAllreduce, P2p, P2pPair, row_of
from checks.result import Result, fail, ok, skip
from checks.tables.datasheet import PCIE_X16_GB_S, form_factor, lookup
from checks.units import MIB

EXPECTATIONS_FILE = Path(__file__).resolve().parents[2] / "templates" / "nccl.yaml"
_NVLINK_GB_S = {True: 50.0, False: 25.0}  # per link and way: NVLink 5 (cc 10+), 2-4 (docs/sources.md#nvlink-per-link)


@functools.cache
def expectations() -> dict[str, dict[Any, float]]:
    """templates/nccl.yaml's ``allreduce_busbw`` table."""
    with EXPECTATIONS_FILE.open(encoding="utf-8") as fh:
        return dict(yaml.safe_load(fh)["allreduce_busbw"])


def _pcie_gb_s(g: GpuFacts) -> float | None:
    """The card's x16 host-link rate, one direction: the datasheet's, else what NVML says the link can train at."""
    spec = lookup(g.name)
    if spec is not None:
        return spec.host_link_gb_s
    if g.pcie_gen_max and g.pcie_width_max and g.pcie_gen_max in PCIE_X16_GB_S:
        return PCIE_X16_GB_S[g.pcie_gen_max] * g.pcie_width_max / 16
    return None


def line_rate(m: MachineFacts, row: P2PBandwidth) -> tuple[float | None, str]:
    """What the pair's path carries in one direction, GB/s, and the path's name."""
    gpus = {g.index: g for g in answering(m)}
    a, b = gpus.get(row.src), gpus.get(row.dst)
    pair = pair_of(m.topology, row.src, row.dst) if m.topology else None
    if a is None or b is None:
        return None, "?"
    nvlink5 = (a.compute_capability or (0, 0))[0] >= 10
    if pair is not None and pair.nvlinks:
        return pair.nvlinks * _NVLINK_GB_S[nvlink5], path_name(pair)
    switched = _switched_links(m, a, b)
    if switched:  # what the box is, not the path it has now: its links are down
        now = path_name(pair) if pair is not None else "PCIe"
        return switched * _NVLINK_GB_S[nvlink5], f"NVLink through the NVSwitches (now {now}: its NVLinks are down)"
    rates = [r for r in (_pcie_gb_s(a), _pcie_gb_s(b)) if r]
    name = path_name(pair) if pair is not None else "PCIe"
    if not rates:
        return None, name
    return (min(rates) / 2, f"{name}, through host memory") if row.peer_access is False else (min(rates), name)


def _p2p_matrix(m: MachineFacts) -> list[str]:
    rows = m.p2p.pairs if m.p2p else ()
    indices = sorted({r.src for r in rows} | {r.dst for r in rows})
    cell = {(r.src, r.dst): ("err" if r.gb_s is None else f"{r.gb_s:.0f}") for r in rows}
    head = "GB/s  " + "".join(f"{'GPU' + str(i):>7}" for i in indices)
    body = [
        f"{'GPU' + str(s):<6}" + "".join(f"{'X' if s == d else cell.get((s, d), '-'):>7}" for d in indices)
        for s in indices
    ]
    return [head, *body]


def judged_pairs(m: MachineFacts) -> list[tuple[P2PBandwidth, float | None, str]]:
    """Every measured pair with its line rate and path name."""
    return [(row, *line_rate(m, row)) for row in (m.p2p.pairs if m.p2p else ())]


def slowest_pair(m: MachineFacts) -> tuple[P2PBandwidth, float | None, str] | None:
    """The pair furthest below its line rate (or the slowest, when no rate is known)."""
    measured = [x for x in judged_pairs(m) if x[0].gb_s is not None]
    if not measured:
        return None
    return min(measured, key=lambda x: (x[0].gb_s or 0.0) / x[1] if x[1] else (x[0].gb_s or 0.0))


def gpu_p2p(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Device-to-device copy bandwidth for every GPU pair, against what its path carries.

    Command line equivalent: nvbandwidth -t device_to_device_memcpy_write_ce
    """
    if len(answering(m)) < 2:
        return [skip("gpu-p2p", "fewer than two GPUs: no GPU pairs")]
    if m.p2p is None or m.p2p.skipped or not m.p2p.pairs:
        reason = (
            m.p2p.skipped
            if m.p2p and m.p2p.skipped
            else "not measured (replayed snapshot or bootstrap without measurements)"
        )
        return [skip("gpu-p2p", reason)]
    tc, tag = cfg.topology, " [recorded]" if m.p2p.recorded else ""
    errors = [r for r in m.p2p.pairs if r.error or r.gb_s is None]
    rates = [r.gb_s for r in m.p2p.pairs if r.gb_s is not None]
    table = "\n".join(_p2p_matrix(m))
    if errors:
        e = errors[0]
        hint = "a copy between these GPUs failed: check `nvidia-smi topo -p2p rw` and dmesg for Xid errors"
        return [
            fail(
                "gpu-p2p",
                f"gpu{e.src}->gpu{e.dst}: {e.error or 'no figure'} ({len(errors)} pair(s)){tag}\n{table}",
                hint,
            )
        ]
    worst = slowest_pair(m)
    assert worst is not None  # rates is not empty: no errors and at least one pair
    row, rate, path = worst
    median = statistics.median(rates)
    summary = f"{len(rates)} pairs, median {median:.0f} GB/s; lowest gpu{row.src}->gpu{row.dst} {row.gb_s:.0f} GB/s over {path}"
    value = {"median_gb_s": round(median, 1), "slowest": f"gpu{row.src}->gpu{row.dst}", "slowest_gb_s": row.gb_s}
    if rate is None:
        return [ok("gpu-p2p", f"{summary} (no line rate known for this card){tag}\n{table}", value=value)]
    fraction = (row.gb_s or 0.0) / rate
    summary += f", {fraction:.0%} of its {rate:.0f} GB/s line rate{tag}\n{table}"
    kw = {"value": value, "expected": f">= {tc.p2p_warn_fraction:.0%} of the path's line rate"}
    hint = (
        f"gpu{row.src}->gpu{row.dst} copies at {fraction:.0%} of its {path} line rate: "
        "`nvidia-smi topo -m` and `nvidia-smi nvlink --status` for the path, `nvidia-smi -q -d PERFORMANCE` for throttling"
    )
    return [graded("gpu-p2p", grade(fraction, tc.p2p_warn_fraction, tc.p2p_fail_fraction), summary, hint, **kw)]


def _switched_links(m: MachineFacts, *gpus: GpuFacts) -> int | None:
    """The NVLink links each of ``gpus`` should have to the NVSwitches: SXM parts on a box with NVSwitches, every
    link on the board (the datasheet's count); None elsewhere (a direct-NVLink or PCIe box has no such promise)."""
    if not m.host.nvswitch_count or not gpus:
        return None
    links = []
    for g in gpus:
        spec, form = lookup(g.name), form_factor(g, m.host.nvswitch_count)
        if not form.sxm or spec is None or not spec.nvlink_links:
            return None
        links.append(spec.nvlink_links)
    return min(links)


def expected_busbw(m: MachineFacts) -> tuple[float | None, str]:
    """The busbw templates/nccl.yaml expects of this box, and what it was chosen by (card and path). An SXM box
    with NVSwitches is expected to give the NVLink figure whatever its links do now (a GPU with its links down
    drags the all-reduce to host memory: that is the fault to find, not the standard to judge by)."""
    gpus, table = answering(m), expectations()
    specs = [lookup(g.name) for g in gpus]
    model = specs[0].model if specs[0] is not None and len({s.model if s else None for s in specs}) == 1 else None
    pairs = m.topology.pairs if m.topology else ()
    gens = [s.pcie_gen for s in specs if s] or [g.pcie_gen_max for g in gpus if g.pcie_gen_max]
    gen = min(gens) if gens else None
    links = _switched_links(m, *gpus)
    if links and pairs and not all(p.nvlinks for p in pairs):
        figure = table.get("nvlink", {}).get(model) if model else None
        down = [f"gpu{g.index}" for g in gpus if (g.nvlink_active or 0) < links]
        now = f"{', '.join(down)} with NVLinks down now" if down else "some pairs without NVLink now"
        return figure, f"{model or gpus[0].name} over NVLink (what this NVSwitch box should give; {now})"
    if pairs and all(p.nvlinks for p in pairs):
        sxm = any(form_factor(g, m.host.nvswitch_count).sxm for g in gpus)
        kind = "nvlink" if sxm or len(gpus) > 2 else "nvlink_bridge"
        figure = table.get(kind, {}).get(model) if model else None
        return figure, f"{model or gpus[0].name} over {'NVLink' if kind == 'nvlink' else 'an NVLink bridge'}"
    if not pairs:
        return None, "no topology recorded"
    host = any(p2p_ok(p) is not True or p.level == 50 for p in pairs if not p.nvlinks)
    kind = "host" if host else "pcie"
    figure = table.get(kind, {}).get(gen) if gen else None
    label = "PCIe P2P" if kind == "pcie" else "host memory (no P2P on some pair)"
    return figure, f"Gen{gen or '?'} {label}"


def _slow_pair_text(m: MachineFacts) -> str:
    worst = slowest_pair(m)
    if worst is None:
        return ""
    row, rate, path = worst
    share = f", {(row.gb_s or 0) / rate:.0%} of its line rate" if rate else ""
    return f"; slowest pair gpu{row.src}->gpu{row.dst} {row.gb_s:.0f} GB/s over {path}{share}"


def gpu_allreduce(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """NCCL all-reduce over all local GPUs: the peak busbw against what the card and path should give.

    Command line equivalent: all_reduce_perf -b 1M -e 1G -f 4 -g <GPUs> (nccl-tests)
    """
    n = len(answering(m))
    ar = m.allreduce_local
    if n < 2:
        return [skip("gpu-allreduce", "fewer than two GPUs: nothing to all-reduce between")]
    if ar is None or ar.skipped or not (ar.rows or ar.error):  # no figures and no failure: nothing was measured
        return [
            skip(
                "gpu-allreduce",
                ar.skipped
                if ar and ar.skipped
                else "not measured (replayed snapshot or bootstrap without measurements)",
            )
        ]
    if ar.error or not ar.rows:
        hint = "rerun with NCCL_DEBUG=INFO to see the transport NCCL picked and where it stopped; see nccl-env and shm"
        socket = broken_socket(m)
        if socket:  # the likeliest cause, found without running anything
            hint = f"{socket}: `unset NCCL_SOCKET_IFNAME` or name one of this host's interfaces; then {hint}"
        return [fail("gpu-allreduce", f"all-reduce over {n} GPUs failed: {ar.error}", hint)]
    return [_judge_allreduce(m, cfg.topology)]


def _judge_allreduce(m: MachineFacts, tc: TopologyConfig) -> Result:
    ar = m.allreduce_local
    assert ar is not None
    best = max(ar.rows, key=lambda r: r.busbw_gb_s)
    tag = " [recorded]" if ar.recorded else ""
    sizes = ", ".join(f"{r.bytes // MIB} MiB {r.busbw_gb_s:.1f}" for r in ar.rows)
    summary = f"{best.backend}, {best.world_size} processes: peak busbw {best.busbw_gb_s:.1f} GB/s at {best.bytes // MIB} MiB (busbw per size: {sizes}){tag}"
    value = {"peak_busbw_gb_s": best.busbw_gb_s, "bytes": best.bytes}
    if best.backend != "nccl":
        return ok("gpu-allreduce", summary + "; not NCCL, not judged", value=value)
    expected, basis = expected_busbw(m)
    if expected is None:
        return ok("gpu-allreduce", f"{summary}; no expected figure for {basis} in templates/nccl.yaml", value=value)
    fraction = best.busbw_gb_s / expected
    summary += f"; {fraction:.0%} of ~{expected:g} GB/s expected for {basis}"
    kw = {"value": value, "expected": f">= {tc.allreduce_warn_fraction * expected:.0f} GB/s"}
    hint = (
        f"all-reduce reaches {fraction:.0%} of what {basis} should give{_slow_pair_text(m)}: see gpu-topology, "
        "gpu-p2p and nccl-env; NCCL_DEBUG=INFO shows the transport (P2P/IPC, SHM, NET) NCCL picked"
    )
    status = grade(fraction, tc.allreduce_warn_fraction, tc.allreduce_fail_fraction)
    return graded("gpu-allreduce", status, summary, hint, **kw)


def p2p_measurements(m: MachineFacts) -> P2p | None:
    """``measurements.p2p``: every measured pair with its line rate and path; None when none was measured."""
    if m.p2p is None or not m.p2p.pairs:
        return None
    pairs = tuple(
        P2pPair(r.src, r.dst, r.gb_s, r.peer_access, rate, path, r.error) for r, rate, path in judged_pairs(m)
    )
    return P2p(m.p2p.mib, pairs)


def allreduce_measurements(m: MachineFacts) -> LocalAllreduce | None:
    """``measurements.allreduce_local``: the sweep's rows and the busbw expected of this box; None when not run."""
    ar = m.allreduce_local
    if ar is None or not ar.rows:
        return None
    expected, basis = expected_busbw(m)
    return LocalAllreduce(tuple(row_of(AllreduceRow, r) for r in ar.rows), expected, basis)
