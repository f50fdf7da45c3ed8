"""``invoke verify --nproc N``: how many processes, the child's DDP block, and the figures of a DDP run.

Plan: one process per GPU torch sees (NCCL), or on a machine without one up to the usable cores (gloo, the cores
shared out as threads, as torchrun's OMP_NUM_THREADS does); ``--nproc 1`` is the one-process run. Started on every
node of a job (``srun --ntasks-per-node=1 invoke verify``, or SkyPilot's one process per node), each node's verify
starts its own ranks and all of them train one DDP run across the job's nodes (``job_node``: torchrun's static
rendezvous on the job's rendezvous address, global ranks node by node); each node then judges its own ranks and
writes its own report. Judge: the
``measurements.ddp`` block (contract below) from every rank's result; the verdicts are in ``diagnosis.py``.

``measurements.ddp``: ``world_size``, ``backend``, ``comm_exposed_ms`` (synchronised minus ``no_sync`` median
forward+backward of the slowest rank: the exchange the step waits for), ``comm_share`` (of the median step),
``scaling_efficiency`` (samples/s of N ranks over N x one process's alone; a command's: ``user/solo.py``), ``grad_bytes`` (all-reduced per step),
``busbw_gbs`` (grad_bytes x 2(N-1)/N over the exposed time: what the exchange moved at least that fast; an
upper bound on the link's busbw when some of it overlapped the backward), ``ab`` (windows, steps, both medians
and their spread), ``per_rank`` ([{rank, median_s, own_s, sync_s, data_wait_share, error, gpu}]: own_s is the
rank's ``no_sync`` median, its speed without waiting for the others; gpu its GPU, see ``gpu_of``). With ``--hosts`` also ``hosts``
([{host, address, ranks}]) and ``link_mbit_s`` (busbw_gbs in Mbit/s: what the network between them carried).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from checks.config import VerifyConfig
from checks.errors import PreflightError
from checks.facts import MachineFacts
from checks.reports.verify import CommFigures, DdpFigures, RankRow
from checks.result import Result, Status, ok, skip
from checks.units import percent, size_decimal
from checks.verify.contract import ChildResult, CommAb, RankDevice, RankResult
from checks.verify.figures import breakdown


def processes(nproc: int, cfg: VerifyConfig, facts: MachineFacts) -> int:
    """The number of ranks for ``--nproc`` (0: the configured count; configured 0: every GPU when two or more)."""
    wanted = nproc or cfg.nproc
    if wanted < 0:
        raise PreflightError(f"--nproc must be 1 or more, got {wanted}", hint="--nproc 2 trains on two ranks")
    gpus = 0 if cfg.device == "cpu" else facts.torch.device_count
    if wanted == 0:
        return gpus if gpus >= 2 else 1
    if gpus and wanted > gpus:
        raise PreflightError(
            f"--nproc {wanted}: torch sees {gpus} GPU(s) here; use at most {gpus} (one process per GPU)",
            hint="or --device cpu to run the ranks on the CPU with gloo",
        )
    cores = int(facts.host.usable_cores)
    if not gpus and wanted > max(1, cores):
        raise PreflightError(
            f"--nproc {wanted}: without a GPU each rank needs a core and {cores} are usable here; use at most {cores}"
        )
    return wanted


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def per_rank(ranks: Sequence[RankResult]) -> tuple[RankRow, ...]:
    """Each rank's measured step median, its own speed (no_sync median), synchronised median and data wait."""
    out = []
    for r in ranks:
        ab = (r.ddp.comm_ab if r.ddp else None) or CommAb()
        wait = round(breakdown(r.steps)["data_wait"], 4) if r.steps else None
        median = _median([s.total for s in r.steps])
        out.append(RankRow(r.rank, median, ab.no_sync_median_s, ab.sync_median_s, wait, r.error, gpu_of(r.device)))
    return tuple(out)


def gpu_of(device: RankDevice | None) -> int | None:
    """The GPU a rank trained on: its NVML index where its UUID maps to one here, else its torch index on its
    host; None on the CPU or when the rank did not say."""
    if device is None or device.type != "cuda":
        return None
    return device.nvml_index if device.nvml_index is not None else device.index


def figures(r: ChildResult) -> DdpFigures | None:
    """``measurements.ddp`` from the combined result (None for a one-process run)."""
    own = r.ddp
    if not own:
        return None
    samples_per_step = r.samples_per_step // own.world_size  # one rank's
    rows = per_rank(r.ranks)
    world = own.world_size
    timed = [(x.own_s, x.sync_s) for x in rows if x.own_s is not None and x.sync_s is not None]
    step = _median([x.median_s for x in rows if x.median_s])
    slowest = max(timed, key=lambda t: t[0]) if timed else None  # by its own step
    exposed = max(0.0, slowest[1] - slowest[0]) if slowest else None
    grad = (own.comm_ab or CommAb()).grad_bytes
    busbw = round(grad * 2 * (world - 1) / world / exposed / 1e9, 3) if grad and exposed else None
    alone = own.solo.median_s if own.solo else None
    return DdpFigures(
        world_size=world,
        backend=own.backend,
        per_rank=rows,
        grad_bytes=grad,
        comm_exposed_ms=None if exposed is None else round(1000 * exposed, 3),
        comm_share=round(exposed / step, 4) if exposed is not None and step else None,
        busbw_gbs=busbw,
        scaling_efficiency=round(alone / step, 4) if alone and step else None,
        samples_per_s=world * samples_per_step / step if step else None,
        samples_per_s_one=samples_per_step / alone if alone else None,
        ab=_ab(own.comm_ab),
        hosts=own.hosts or None,  # --hosts: the exchange crossed the network between them
        link_mbit_s=round(busbw * 8000, 1) if busbw and own.hosts else None,
    )


def _ab(ab: CommAb | None) -> CommFigures | None:
    """The A/B's own figures: its windows and the spread of each leg (the noise the exposed time sits in)."""
    if ab is None:
        return None
    sync, local = ab.sync_s or (), ab.no_sync_s or ()
    return CommFigures(
        ab.windows,
        ab.window_steps,
        ab.sync_median_s,
        ab.no_sync_median_s,
        round(statistics.pstdev(sync), 7) if len(sync) > 1 else None,
        round(statistics.pstdev(local), 7) if len(local) > 1 else None,
    )


def accumulation(comm_share: float, target: float, most: int = 16) -> int | None:
    """The smallest k so that syncing every k micro-steps brings the exposed share under ``target``."""
    for k in range(2, most + 1):
        c = comm_share / k
        if c / (1 - comm_share + c) < target:
            return k
    return None if comm_share >= 1 else most


def straggler(rows: Sequence[RankRow], cfg: VerifyConfig) -> dict[str, Any] | None:
    """The one rank whose own step is ``straggler_share`` above the others' median (None when none or unsure)."""
    timed = [(x.own_s, x.rank) for x in rows if x.own_s]
    if len(timed) < 2:
        return None
    worst = max(timed, key=lambda t: t[0])
    others = statistics.median(own for own, rank in timed if rank != worst[1])
    score = worst[0] / others - 1 if others > 0 else math.inf
    if score < cfg.straggler_share:
        return None
    steps = [x.median_s for x in rows if x.median_s]
    if steps and worst[0] - others < cfg.share_warn * statistics.median(steps):
        return None  # slower, but what the others wait for it is a small part of the step (noise on a busy box)
    return {"rank": worst[1], "own_s": worst[0], "others_s": others, "score": round(score, 3)}


def straggler_text(
    found: dict[str, Any], d: DdpFigures, gate: Sequence[Result] | None
) -> tuple[str, str, dict[str, Any]]:
    """The straggler's summary, fix and evidence: the rank, its GPU ("CPU" without one) and what bootstrap's
    fast checks (verify's gate rows, subjects ``gpuN``) say about that GPU."""
    gpu = next((x.gpu for x in d.per_rank if x.rank == found["rank"]), None)
    where = "CPU" if gpu is None else f"gpu{gpu}"
    host = next((h.host for h in d.hosts or () if found["rank"] in h.ranks), None)
    summary = (
        f"rank {found['rank']} ({where}{f' on {host}' if host else ''}) takes {1000 * found['own_s']:.1f} ms per "
        f"step on its own, the others {1000 * found['others_s']:.1f} ms ({100 * found['score']:.0f}% slower): "
        "every all-reduce waits for it"
    )
    ev = found | {"gpu": gpu, "device": where, "host": host}
    if gpu is None:
        fix = f"on the CPU, what else runs on rank {found['rank']}'s cores (top), and its data shard"
        return summary, fix, ev
    flagged = _flagged(where, gate) if gate is not None and not host else None
    said = _bootstrap_says(where, host, gate, flagged)
    ev |= {"bootstrap": flagged, "bootstrap_says": said}
    hints = list(dict.fromkeys(r["hint"] for r in flagged or [] if r.get("hint")))
    fix = (
        f"fix what bootstrap flags on {where} first: {'; '.join(hints) or 'see invoke bootstrap'}; then its data shard"
        if flagged
        else f"watch {where} during a run (nvidia-smi -i {gpu} dmon -s pucm: power, clocks, other tenants) "
        "and look at its data shard"
    )
    return f"{summary}; {said}", fix, ev


def _flagged(where: str, gate: Sequence[Result]) -> list[dict[str, Any]] | None:
    """The gate's warn/fail/error rows about ``where`` (None: the gate has no row about it at all)."""
    mine = [r for r in gate if r.subject == where]
    if not mine:
        return None
    bad = (Status.WARN, Status.FAIL, Status.ERROR)
    return [
        {"id": r.id, "status": r.status.value, "summary": r.summary, "hint": r.hint} for r in mine if r.status in bad
    ]


def _bootstrap_says(where: str, host: str | None, gate: Sequence[Result] | None, flagged: list[Any] | None) -> str:
    if host:
        return f"verify --hosts does not run bootstrap's checks: invoke bootstrap --hosts judges {where} on {host}"
    if gate is None:
        return f"bootstrap's checks are not in this report: invoke bootstrap judges {where}"
    if flagged is None:
        return f"bootstrap has no finding about {where} (NVML did not list it)"
    if not flagged:
        return f"bootstrap found nothing wrong with {where}"
    return f"bootstrap flags {where}: " + "; ".join(f"{r['id']} {r['status']}: {r['summary']}" for r in flagged)


LATENCY_BOUND_BYTES = 1e6  # under this per step an all-reduce is latency, not bandwidth (tool-defined, an estimate)


def link_mbit_s(d: DdpFigures) -> float | None:
    """Across hosts: what the network carried while the exchange was exposed: the ring all-reduce's bus bytes
    (2(n-1)/n of the gradients) over the exposed exchange, in Mbit/s (a floor: a part of the exchange the backward
    hid is left out)."""
    grad, exposed, world = d.grad_bytes, d.comm_exposed_ms, d.world_size or 1
    if not grad or not exposed or world < 2:
        return None
    return round(grad * 2 * (world - 1) / world * 8 / (exposed / 1000) / 1e6, 1)


def comm_text(d: DdpFigures, target: float) -> tuple[str, str]:
    """The comm-bound summary and its fixes, ranked by the step time each would save on these numbers."""
    share, ms, grad = d.comm_share or 0.0, d.comm_exposed_ms or 0.0, d.grad_bytes or 0
    bw = f", at least {d.busbw_gbs:g} GB/s busbw" if d.busbw_gbs else ""
    across = f" across {len(d.hosts)} hosts" if d.hosts else ""
    link = f", about {d.link_mbit_s:g} Mbit/s on the link while they waited" if d.hosts and d.link_mbit_s else ""
    summary = (
        f"{d.world_size} ranks ({d.backend}){across} wait {ms:.1f} ms per step for the gradient exchange, "
        f"{percent(share)} of the step ({size_decimal(grad)} all-reduced per step{bw}{link})"
    )
    k = accumulation(share, target)
    ranked = []
    if k:
        saved = share * (1 - 1 / k)
        ranked.append(
            (
                saved,
                f"sync every {k} micro-steps (forward+backward under model.no_sync() for the others): -{100 * saved:.0f}% step time",
            )
        )
    hook = (
        "model.register_comm_hook(None, bf16_compress_hook) (torch.distributed.algorithms.ddp_comm_hooks.default_hooks)"
    )
    if grad >= LATENCY_BOUND_BYTES:
        ranked.append(
            (share / 2, f"bf16 gradients: {hook} halves the bytes: about -{percent(share / 2)} (an estimate)")
        )
    else:  # a few KB go out in one message: its time is latency, which half the bytes does not change
        ranked.append(
            (
                0.0,
                f"bf16 gradients ({hook}) halve the bytes, but {size_decimal(grad)} a step is latency, not bytes: little to gain",
            )
        )
    ranked.append(
        (
            0.0,
            "DistributedDataParallel(bucket_cap_mb=...): larger buckets overlap more of the exchange with the backward (not measured here)",
        )
    )
    hosts = d.hosts or ()
    if hosts:
        summary += f" across {len(hosts)} hosts" + (
            f": the link carried at least {d.link_mbit_s:,.0f} Mbit/s of busbw" if d.link_mbit_s else ""
        )
    link = (
        f"one box with all {d.world_size} ranks instead of {len(hosts)} hosts (bootstrap --hosts measures the link "
        "itself: net-link), or hosts joined by a faster interconnect (InfiniBand / RoCE at 100-400 Gbit/s)"
        if hosts
        else "one box whose GPUs share NVLink (ring busbw ~230 GB/s on 8x A100 SXM, ~370 on 8x H100; PCIe-only boxes ~20-35: docs/sources.md#nccl-ring-efficiency) instead of PCIe or two boxes"
        if d.backend == "nccl"
        else "on GPUs the exchange goes over NVLink, PCIe or the network instead: run verify --nproc on the GPU box"
    )
    ranked.append((0.0, link))
    fixes = [text for _, text in sorted(ranked, key=lambda x: -x[0])]
    return summary, "; ".join(f"{i + 1}) {t}" for i, t in enumerate(fixes))


def ddp_result(d: DdpFigures | None) -> Result:
    """``verify-ddp``: the exchange, the scaling and each rank's own step, in one line (verdicts judge them)."""
    if d is None:
        return skip("verify-ddp", "one process: no DDP figures")
    eff = d.scaling_efficiency
    if eff is not None and d.samples_per_s and d.samples_per_s_one:
        scaling = (
            f"scaling efficiency {100 * eff:.0f}% ({d.samples_per_s:.1f} samples/s against {d.world_size} x "
            f"{d.samples_per_s_one:.1f} of one process alone)"
        )
    else:
        scaling = f"no scaling efficiency: {d.scaling_note or 'no one-process run'}"
    exchange = (
        f"exposed communication {d.comm_exposed_ms:.1f} ms per step ({100 * (d.comm_share or 0):.0f}% of the step, "
        f"{(d.grad_bytes or 0) / 1e6:.1f} MB of gradients)"
        if d.comm_exposed_ms is not None
        else "the exchange not timed"
    )
    ranks = ", ".join(f"rank {x.rank} {1000 * x.own_s:.1f}" for x in d.per_rank if x.own_s is not None)
    summary = f"{d.world_size} ranks ({d.backend}): {exchange}; {scaling}; own step ms: {ranks or 'none'}"
    return ok("verify-ddp", summary, value=eff)
