"""Verdicts: where a training step's time goes, what to fix, how sure we are. Pure: signals in, verdicts out.

Rules, thresholds and their sources are docs/sources.md#verdict-rules (V1-V11); every threshold is a key under
``preflight.verify``. A rule abstains when its inputs are missing (never reads a missing signal as zero), and
GPU utilisation is never a verdict on its own (docs/sources.md#nvml-utilization). Verdict ids (the ``diagnosis`` result's value):

- ``data-bound``: the device waits for the next batch (V1: data wait share >= share_warn).
- ``cpu-starved``: data-bound while the training process tree keeps the usable cores saturated (V1a).
- ``h2d-bound``: host-to-device copies take a large share (V2).
- ``launch-bound``: the GPU idles between many tiny kernels inside the compute window (V3).
- ``checkpoint-bound``: checkpoint saves, amortised over the interval, take a large share (V7).
- ``near-oom``: peak reserved memory near the card's size, fragmentation, or an OOM at the asked batch (V9/V10).
- ``throttled``: SM clock well below its maximum with power or thermal reasons (V11).
- ``cpu-contended``: other processes keep the usable cores busy during the run (a caveat on every figure).
- ``comm-bound``: several processes: the gradient exchange the step waits for (synchronised minus ``no_sync``
  step) takes share_warn of the step or more; evidence: gradient bytes, the busbw it implies, the fixes ranked.
- ``straggler``: several processes: one rank's own step (its ``no_sync`` steps) is ``straggler_share`` slower
  than the others' median; everyone waits for it at every all-reduce. Names the rank, its GPU and what
  bootstrap's gate rows say about that GPU.
- ``compute-bound``: forward + backward + optimizer dominate: healthy; only now does a bigger GPU help (V5).
- ``cant-tell``: no single cause clears its threshold, or the run did not produce enough to judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from checks.config import VerifyConfig
from checks.machine.gpu import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from checks.reports.verify import DdpFigures
from checks.result import Result
from checks.units import GIB
from checks.verify import distributed
from checks.verify.stop import MIN_MEASURED

TIME_VERDICTS = ("data-bound", "cpu-starved", "h2d-bound", "launch-bound", "checkpoint-bound", "comm-bound")
_THROTTLE_BITS = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
# cpu-contended when others take this share of the busy cores or more. A CPU hog per core on the 2-core box left the
# training 50% of them (the scheduler's fair share; its 224 px steps took 11.6-24 s): contention, which the earlier
# rule (others more than the training) missed. A training at 90% beside a 10% neighbour is not. Tool-defined.
NEIGHBOURS = 1 / 3
_RANK = {
    "cpu-contended": -1,  # a crowded box slows every figure: named first, whatever else the run shows
    "near-oom": 1,
    "straggler": 2,
    "throttled": 2,
    "compute-bound": 3,
    "cant-tell": 5,
}  # time: 0, by share


@dataclass(frozen=True)
class Verdict:
    """One finding: what, how bad, how sure, the numbers behind it, and the fix."""

    id: str
    severity: str  # critical | warn | info
    confidence: str  # high | medium | low
    summary: str
    fix: str
    share: float = 0.0  # the share of step time it explains (ranks the time verdicts)
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "confidence": self.confidence,
            "summary": self.summary,
            "fix": self.fix,
            "share": round(self.share, 4),
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Signals:
    """What the smoke run measured; ``None`` means not measured here (the rule that needs it abstains)."""

    steps: int
    device: str  # "cuda" | "cpu"
    shares: dict[str, float]  # checks.verify.figures.breakdown
    step_s: float  # mean seconds per step (checkpoints amortised in)
    workers: int = 0
    usable_cores: float = 1.0
    cpu_during_wait: float | None = None  # fraction of usable cores the process tree used while waiting for data
    machine_cpu_during_wait: float | None = None  # fraction of the usable cores busy (any process) meanwhile
    iowait_during_wait: float | None = None  # %
    kernels: dict[str, Any] | None = None  # checks.verify.smoke.extras.kernel_summary
    memory: dict[str, Any] | None = None  # checks.verify.smoke.extras.memory
    gpu: dict[str, Any] | None = None  # checks.verify.sampler.gpu_summary
    checkpoint: dict[str, Any] | None = None  # save_s, bytes, every_steps
    oom: dict[str, Any] | None = None
    precision: str = "fp32"
    machine_cpu: float | None = None  # median fraction of the usable cores busy (any process) over the window
    tree_cpu: float | None = None  # median fraction of the usable cores the training processes used
    sampler_coverage: float | None = None  # samples taken in the measured window / samples due at the interval
    ddp: DdpFigures | None = None  # measurements.ddp (checks.verify.distributed.figures); None: one process
    gate: tuple[Result, ...] | None = None  # bootstrap's fast checks as verify ran them; None: not run
    own_code: bool = False  # the user's model or data (--model/--dataset) or their own command ran, not the built-in
    bf16_native: bool | None = None  # a CPU run in bf16: this CPU has avx512_bf16/amx_bf16 (None: not read)
    item_cost: dict[str, Any] | None = None  # checks.verify.user.itemcost: __getitem__ and collate, timed in the run
    ops_per_step: int | None = None  # the ops one (warm-up) step dispatched, views left out (the FLOP count's)
    flops_per_step: int | None = None  # that step's matrix FLOPs


def diagnose(s: Signals, cfg: VerifyConfig) -> list[Verdict]:
    """Every verdict that fires, the primary one first."""
    if s.oom is not None:
        return [_oom(s.oom)]
    if s.steps < 2:  # too few to split the step; what the sampler saw of the machine still holds
        few = Verdict(
            "cant-tell", "warn", "low", f"only {s.steps} measured step(s): too few to judge", "run more steps"
        )
        seen = [v for rule in (_contended, _throttle) if (v := rule(s, cfg)) is not None]
        return sorted([few, *seen], key=lambda v: _RANK.get(v.id, 0))
    found = [v for rule in (_data, _h2d, _checkpoint, _launch, _comm) if (v := rule(s, cfg)) is not None]
    found = [_with_item_cost(v, s) for v in found]
    found += [v for rule in (_memory, _throttle, _contended, _straggler) if (v := rule(s, cfg)) is not None]
    if not any(v.id in TIME_VERDICTS for v in found):
        found.append(_compute_or_abstain(s, cfg))
    return sorted(found, key=lambda v: (_RANK.get(v.id, 0), -v.share))


def _severity(share: float, s: Signals, cfg: VerifyConfig, warn_at: float) -> tuple[str, str]:
    """critical/warn by share, capped at warn below the minimum steps; confidence follows."""
    critical = share >= max(cfg.share_critical, warn_at) and s.steps >= cfg.critical_min_steps
    return ("critical", "high") if critical else ("warn", "medium" if s.steps >= cfg.critical_min_steps else "low")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _data(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    d = s.shares["data_wait"]
    if d < cfg.share_warn:
        return None
    severity, confidence = _severity(d, s, cfg, cfg.share_warn)
    ev: dict[str, Any] = {"data_wait_share": round(d, 4), "workers": s.workers, "usable_cores": s.usable_cores}
    ev |= {"cpu_during_wait": s.cpu_during_wait, "machine_cpu_during_wait": s.machine_cpu_during_wait}
    ev |= {"iowait_during_wait_pct": s.iowait_during_wait, "sampler_coverage": s.sampler_coverage}
    waits = f"the loop waits for data {_pct(d)} of each step"
    starved = _starved(s, cfg, waits)
    if starved is not None:
        return Verdict("cpu-starved", severity, confidence, starved[0], starved[1], d, ev)
    if s.iowait_during_wait is not None and s.iowait_during_wait >= cfg.iowait_high_pct:
        summary = f"{waits} with iowait at {s.iowait_during_wait:.0f}%: reading is the limit"
        return Verdict("data-bound", severity, confidence, summary, disk_estimate(d), d, ev)
    if s.workers == 0:
        pin = ", pin_memory=True" if s.device == "cuda" else ""  # pinned pages speed a copy to a GPU, nothing else
        fix = f"set num_workers > 0 (the main process loads every batch itself){pin}, persistent_workers=True"
        return Verdict("data-bound", severity, confidence, f"{waits}; num_workers=0", fix, d, ev)
    cpu = "" if s.cpu_during_wait is None else f"; CPU {_pct(s.cpu_during_wait)} of the usable cores meanwhile"
    if s.cpu_during_wait is None:  # no sample fell into a wait: CPU-starved and slow reads look the same from here
        confidence = "low"
        got = "" if s.sampler_coverage is None else f" (it took {_pct(s.sampler_coverage)} of its samples)"
        cpu = f"; the sampler saw no CPU figures during the waits{got}, so CPU-starved can't be told apart"
    fix = (
        "each batch takes longer to produce than to train on: raise num_workers towards the usable cores, "
        "prefetch_factor, persistent_workers=True; make __getitem__ cheaper (pre-decode with invoke stage-data)"
    )
    return Verdict("data-bound", severity, confidence, f"{waits} with {s.workers} worker(s){cpu}", fix, d, ev)


def disk_estimate(data_wait: float) -> str:
    """A faster disk cannot be measured here: the bound from the data-wait share (Amdahl), labelled an estimate."""
    return (
        "copy the dataset to local NVMe or /dev/shm first (invoke stage-data); pack small files into arrays: an "
        f"estimate from the data-wait share, not measured here: at most -{100 * data_wait:.0f}% step time"
    )


def _starved(s: Signals, cfg: VerifyConfig, waits: str) -> tuple[str, str] | None:
    """V1a: the usable cores are saturated while the loop waits: by the training processes, or by a neighbour.

    A neighbour is blamed by its effect (a run on the 2-core box once called 10% of one core the cause of a
    run whose own processes took 89%): only when it takes ``contended_min_share`` of the cores or more and our pipeline's
    need (its CPU scaled up to remove the wait, ``mine / (1 - data wait)``) would fit in the cores without it.
    """
    mine, machine, cores = s.cpu_during_wait, s.machine_cpu_during_wait, f"{s.usable_cores:g} usable cores"
    others = max(0.0, machine - mine) if machine is not None and mine is not None else None
    wants = mine is not None and mine >= cfg.cpu_saturated_fraction / 4  # tool-defined: a quarter of saturation
    full = machine is not None and machine >= cfg.cpu_saturated_fraction
    if others is not None and wants and full and _neighbour_explains(s, cfg, mine or 0.0, others):
        summary = (
            f"{waits}; the {cores} are {_pct(machine or 0)} busy meanwhile (the training processes {_pct(mine or 0)}, "
            f"others {_pct(others)}): other processes take the CPU the loop needs"
        )
        return summary, "find what else runs on this machine (top); on a shared box, rent cores that are yours"
    if mine is not None and (mine >= cfg.cpu_saturated_fraction or (wants and full)):
        crowd = s.workers > s.usable_cores
        fix = (
            f"{s.workers} workers on {cores} only contend: use at most {max(1, int(s.usable_cores) - 1)}; "
            if crowd
            else ""
        )
        fix += "move decoding/augmentation off the CPU or do it once ahead of time (invoke stage-data), or rent more cores per GPU"
        return (
            f"{waits}; the training processes keep {_pct(mine)} of {cores} busy meanwhile{_others(s, cfg, mine, others)}",
            fix,
        )
    return None


def _others(s: Signals, cfg: VerifyConfig, mine: float, others: float | None) -> str:
    """What other processes' CPU during the waits means when they are not the cause: too little to matter, or
    a real share that slows the loop while even every core would not end the wait (``_neighbour_explains``)."""
    if not others or others < 0.01:
        return ""
    if others < cfg.contended_min_share:
        return f"; others {_pct(others)}, too little to explain the wait"
    needs = 1 / _unwaited(s)
    return (
        f"; others take {_pct(others)} too, but every core would not end the wait: the loop needs data {needs:,.1f}x"
        f" as fast as it comes, and the training processes could get at most {1 / max(mine, 1e-9):,.1f}x the CPU"
    )


def _unwaited(s: Signals) -> float:
    """The share of the step the loop does not wait for data: the loop needs data 1 / this times as fast."""
    return max(1e-9, 1 - s.shares["data_wait"])


def _neighbour_explains(s: Signals, cfg: VerifyConfig, mine: float, others: float) -> bool:
    """Others take a measurable part of the cores, and without them ours would cover what the loop needs."""
    need = mine / _unwaited(s)
    return others >= cfg.contended_min_share and need <= 1.0


def _h2d(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    h = s.shares["h2d"]
    if h < cfg.share_warn:
        return None
    severity, confidence = _severity(h, s, cfg, cfg.share_warn)
    fix = "pin_memory=True with .to(device, non_blocking=True); send uint8 and normalise on the GPU"
    return Verdict("h2d-bound", severity, confidence, f"host-to-device copies take {_pct(h)} of each step", fix, h)


def _checkpoint(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    c, l_share = s.checkpoint, s.shares["checkpoint"]
    if c is None or l_share < cfg.checkpoint_share_warn:
        return None
    severity, confidence = _severity(l_share, s, cfg, cfg.checkpoint_share_warn)
    rate = c["bytes"] / c["save_s"] / 1e6 if c.get("save_s") else None
    speed = f" ({c['bytes'] / 1e6:.0f} MB at {rate:.0f} MB/s)" if rate else ""
    summary = f"a checkpoint save takes {c['save_s']:.2f} s{speed}; every {c['every_steps']} steps that is {_pct(l_share)} of the time"
    fix = "save to local disk and upload in the background (or torch.distributed.checkpoint's async save); save less often"
    return Verdict("checkpoint-bound", severity, confidence, summary, fix, l_share, dict(c))


def _launch(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    k = s.kernels
    if s.device != "cuda" or not k or k.get("busy_fraction") is None or k.get("median_kernel_us") is None:
        return None
    compute = s.shares["forward"] + s.shares["backward"] + s.shares["optimizer"]
    busy, median = k["busy_fraction"], k["median_kernel_us"]
    if compute < 0.5 or busy >= cfg.launch_busy_max or median > cfg.launch_kernel_us_max:
        return None
    share = compute * (1 - busy)
    severity, confidence = _severity(share, s, cfg, cfg.share_warn)
    summary = (
        f"the GPU computes only {_pct(busy)} of the compute window: {k['kernels_per_step']:.0f} kernels per step, "
        f"median {median:.1f} µs"
    )
    fix = "torch.compile(model, mode='reduce-overhead') (CUDA graphs) or fusion; a larger batch; a fused/foreach optimizer"
    return Verdict("launch-bound", severity, confidence, summary, fix, share, dict(k))


def _memory(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    m = s.memory
    if not m or not m.get("total_bytes"):
        return None
    total, reserved = m["total_bytes"], m.get("peak_reserved_bytes") or m.get("reserved_bytes") or 0
    allocated, retries = m.get("allocated_bytes") or 0, m.get("num_alloc_retries") or 0
    ev = {k: m.get(k) for k in ("total_bytes", "peak_reserved_bytes", "allocated_bytes", "num_alloc_retries")}
    fix = "activation checkpointing (~20% slower), bf16, a smaller micro-batch with gradient accumulation"
    if reserved >= cfg.near_oom_fraction * total:
        summary = f"peak reserved memory is {_pct(reserved / total)} of the GPU's {total / GIB:.0f} GiB"
        return Verdict("near-oom", "critical", "high", summary, fix, 0.0, ev)
    fragmented = allocated and reserved / allocated >= cfg.fragmentation_ratio
    if retries or (fragmented and reserved >= cfg.fragmentation_min_fraction * total):
        summary = f"allocator fragmentation: reserved {reserved / GIB:.1f} GiB for {allocated / GIB:.1f} GiB allocated, {retries} allocation retries"
        fix = "PYTORCH_ALLOC_CONF=expandable_segments:True (invoke alloc-conf); max_split_size_mb only as a last resort"
        return Verdict("near-oom", "warn", "medium", summary, fix, 0.0, ev)
    return None


def _contended(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    return contended(s.machine_cpu, s.tree_cpu, cfg)


def contended(busy: float | None, mine: float | None, cfg: VerifyConfig) -> Verdict | None:
    """The usable cores are saturated over the window (``busy``, a fraction of them), mostly not by the training
    (``mine``): a neighbour slows every step. Also ``invoke watch``'s, over its samples."""
    if busy is None or mine is None or busy < cfg.cpu_saturated_fraction or busy - mine < NEIGHBOURS * busy:
        return None
    if busy - mine < cfg.contended_min_share:  # by its effect: a small neighbour on a near-idle box is no cause
        return None
    summary = f"the usable cores were {_pct(busy)} busy, the training processes used {_pct(mine)} of them"
    fix = "other processes take the CPU (top): stop them, or rent cores that are yours; every figure here is slowed by them"
    return Verdict("cpu-contended", "warn", "medium", summary, fix, 0.0, {"machine_cpu": busy, "tree_cpu": mine})


def _comm(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    """Several processes: the exchange the step waits for takes share_warn of it (TraceML's 10%, as V1/V2)."""
    d = s.ddp
    share = d.comm_share if d else None
    if d is None or share is None or share < cfg.share_warn:
        return None
    severity, confidence = _severity(share, s, cfg, cfg.share_warn)
    summary, fix = distributed.comm_text(d, cfg.share_warn)
    keys = ("world_size", "backend", "comm_exposed_ms", "grad_bytes", "busbw_gbs", "ab", "hosts", "link_mbit_s")
    figures = d.to_json()
    ev = {k: figures[k] for k in keys if k in figures}
    return Verdict("comm-bound", severity, confidence, summary, fix, share, ev)


def _straggler(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    """Several processes: one rank's own step is straggler_share slower than the others' (TraceML's score); named
    with its GPU and what bootstrap's gate says about that GPU."""
    found = distributed.straggler(s.ddp.per_rank, cfg) if s.ddp else None
    if found is None or s.ddp is None:
        return None
    summary, fix, evidence = distributed.straggler_text(found, s.ddp, s.gate)
    return Verdict("straggler", "warn", "medium", summary, fix, found["score"], evidence)


def _throttle(s: Signals, cfg: VerifyConfig) -> Verdict | None:
    return throttle_verdict(s.gpu, cfg)


def throttle_verdict(g: dict[str, Any] | None, cfg: VerifyConfig) -> Verdict | None:
    """V11 from a sampler GPU summary: median SM clock under the fraction of max, with power/thermal reasons."""
    if not g or not g.get("sm_mhz") or not g.get("sm_max_mhz"):
        return None
    clock, top, reasons = g["sm_mhz"]["p50"], g["sm_max_mhz"], int(g.get("clock_reasons_seen") or 0)
    if clock >= cfg.throttle_clock_fraction * top or not reasons & _THROTTLE_BITS:
        return None
    summary = f"SM clock {clock:.0f} MHz is {_pct(clock / top)} of its {top:.0f} MHz maximum (clock-event reasons {hex(reasons)})"
    fix = "not your code: the card is power- or heat-limited; ask the provider, or rent another box (see bootstrap's gpu-power, gpu-throttle)"
    return Verdict(
        "throttled", "warn", "medium", summary, fix, 0.0, {"sm_mhz_p50": clock, "sm_max_mhz": top, "reasons": reasons}
    )


def _compute_or_abstain(s: Signals, cfg: VerifyConfig) -> Verdict:
    c = s.shares["forward"] + s.shares["backward"] + s.shares["optimizer"]
    ev: dict[str, Any] = {k: round(v, 4) for k, v in s.shares.items()}
    if c >= cfg.compute_bound_min:
        # fewer than a settled verdict's steps (the budget of a slow or crowded box cut them): low
        confidence = "high" if s.steps >= cfg.critical_min_steps else "medium" if s.steps >= MIN_MEASURED else "low"
        faster = (
            "torch.compile, a faster GPU"
            if s.precision in ("bf16", "fp16")
            else "bf16 autocast, torch.compile, a faster GPU"
        )
        fix = f"healthy: the model's math is the limit. Faster math: {faster}"  # no bf16 for a run already in 16 bits
        if s.device == "cuda" and s.precision == "fp32":
            fix = "compute-bound in fp32: bf16 autocast (or torch.set_float32_matmul_precision('high')) uses the tensor cores"
        summary, severity = f"forward + backward + optimizer take {_pct(c)} of each step", "info"
        if emulated_bf16(s):  # not healthy: the math is converted to fp32 and back around every kernel
            summary += f"; {BF16_EMULATED} (no avx512_bf16 or amx_bf16 flag): not healthy compute"
            fix, severity = EMULATED_FIX, "warn"
            ev["bf16_native"] = False
        projection = gpu_projection(s)
        if projection is not None:
            summary += f"; {projection['text']}"
            ev["gpu_projection"] = {k: v for k, v in projection.items() if k != "text"}
        return Verdict("compute-bound", severity, confidence, summary, fix, c, ev)
    top = max(("data_wait", "h2d", "checkpoint"), key=lambda k: s.shares[k])
    summary = f"no single bottleneck: compute {_pct(c)}, the largest other share ({top}) {_pct(s.shares[top])}"
    return Verdict(
        "cant-tell",
        "warn",  # the report's diagnosis row is a warn too: a run that could not be judged has not cleared the box
        "medium",
        summary,
        "nothing stands out: no one part holds the step; torch.profiler on a few steps splits the largest share further"
        if s.own_code
        else "nothing stands out; compare with your real training (--model/--dataset, or verify -- your command)",
        0.0,
        ev,
    )


BF16_EMULATED = "bf16 is emulated on this CPU"
EMULATED_FIX = (
    "bf16 is emulated on this CPU (docs/sources.md#cpu-bf16): drop the bf16 autocast here and train in fp32, or use "
    "a CPU with avx512_bf16/amx_bf16 or a GPU; faster math after that: torch.compile"
)


def emulated_bf16(s: Signals) -> bool:
    """A CPU run in bf16 on a CPU without native bf16: its compute is conversions around fp32 math."""
    return s.device == "cpu" and s.precision == "bf16" and s.bf16_native is False


# A CPU run's step of many small ops projected onto a GPU (an estimate, never a verdict): each op is at least one
# kernel launch of 5-20 µs of host time (docs/sources.md#hta; the low end taken), and the step's matrix FLOPs run
# at GPU_FLOPS. Tool-defined: MANY_OPS (counted here: a 48-block MLP of Linear(64, 64) dispatches 398 ops a step
# with SGD, a two-conv net with Adam 77, four Linear(1024, 1024) with AdamW 136) and GPU_FLOPS, 10 TFLOP/s (about
# an older GPU's fp32 rate: a slow GPU, so the launches must outlast even its math to be named).
LAUNCH_S = 5e-6
MANY_OPS = 200
GPU_FLOPS = 10e12


def gpu_projection(s: Signals) -> dict[str, Any] | None:
    """For a CPU run of many small ops: on a GPU the launches alone (ops x ``LAUNCH_S``) would outlast the math
    (FLOPs at ``GPU_FLOPS``), so the step would likely be launch-bound there. None otherwise (a GPU run, a
    step of few ops or of large ones, or nothing counted)."""
    ops, flops = s.ops_per_step, s.flops_per_step
    if s.device != "cpu" or not ops or ops < MANY_OPS or flops is None:
        return None
    launches_ms, math_ms = 1e3 * ops * LAUNCH_S, 1e3 * flops / GPU_FLOPS
    if launches_ms <= math_ms:
        return None
    text = (
        f"on a GPU (estimate): {ops} ops per step of {flops / ops / 1e6:,.2g} MFLOP each are at least "
        f"{launches_ms:.3g} ms of kernel launches (5 µs each, docs/sources.md#hta) against {math_ms:.2g} ms of math "
        f"at {GPU_FLOPS / 1e12:.0f} TFLOP/s: likely launch-bound there (torch.compile, CUDA graphs, larger layers)"
    )
    return {"ops_per_step": ops, "launches_ms": round(launches_ms, 3), "math_ms": round(math_ms, 4), "text": text}


def _with_item_cost(v: Verdict, s: Signals) -> Verdict:
    """A data verdict with where a sample's time goes, where the run timed it (``Signals.item_cost``)."""
    c = s.item_cost
    if v.id not in ("data-bound", "cpu-starved") or not c:
        return v
    text = item_cost_text(c)
    return replace(v, summary=f"{v.summary}; {text}", evidence={**v.evidence, "item_cost": c})


def item_cost_text(c: dict[str, Any]) -> str:
    """ "each sample takes X ms in __getitem__ (N per step = Y ms), collate Z ms" (and where it was timed)."""
    n, per = c.get("samples_per_step"), c["getitem_ms_per_sample"]
    step = f" ({n} per step = {c['getitem_ms_per_step']:,.1f} ms)" if n and c.get("getitem_ms_per_step") else ""
    text = f"each sample takes {per:,.2f} ms in __getitem__{step}, collate {c['collate_ms_per_batch']:,.2f} ms a batch"
    if c.get("workers"):
        text += f" (timed in the {c['workers']} workers, which share that work)"
    return text


def _oom(oom: dict[str, Any]) -> Verdict:
    fit = oom.get("largest_fit") or 0
    mem = oom.get("memory") or {}
    total = mem.get("total_bytes")
    where = (
        f" ({(mem.get('peak_reserved_bytes') or 0) / GIB:.1f} of {total / GIB:.0f} GiB reserved at peak)"
        if total
        else ""
    )
    summary = f"out of memory at batch {oom['batch']}{where}; the largest batch that fits is {fit}"
    fix = f"--batch-size {fit} with gradient accumulation for the same global batch; bf16; activation checkpointing"
    return Verdict("near-oom", "critical", "high", summary, fix, 1.0, dict(oom))


def upgrade_bound(s: Signals) -> dict[str, Any]:
    """Amdahl: only the compute share scales with a faster GPU; data, copies, launches and saves do not."""
    compute = s.shares["forward"] + s.shares["backward"] + s.shares["optimizer"]
    busy = (s.kernels or {}).get("busy_fraction")
    scalable = compute * busy if busy is not None else compute
    return {
        "scalable_share": round(scalable, 4),
        "max_step_time_cut": round(scalable, 4),
        "max_throughput_gain": round(1 / (1 - scalable) - 1, 3) if scalable < 1 else None,
        "step_time_cut_at_2x": round(scalable / 2, 4),
    }
