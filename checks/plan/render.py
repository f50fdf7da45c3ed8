"""``invoke plan``'s text: the model, the memory terms on the best option, one row per card class, one line."""

from __future__ import annotations

from checks.plan.cards import Option
from checks.plan.memory import states
from checks.plan.run import PlanResult
from checks.units import GB, GIB, MIB, money

TERMS = (
    "weights",
    "grads",
    "master",
    "optimizer",
    "ddp_buckets",
    "gathered",
    "activations",
    "cuda_context",
    "nccl",
    "fragmentation",
)


def _gb(value: float) -> str:
    return f"{value / GB:,.1f} GB" if value >= 0.05 * GB else f"{value / MIB:,.0f} MiB"


def _row(o: Option, time: dict[str, float] | None) -> str:
    mark = "*" if o.this_box else " "
    fit = (f"{o.gpus} x {o.sharding}" if o.gpus > 1 else "1 GPU") if o.fits else "no"
    # usable: what the plan fills on one card (its NVML total; this box: its free memory), in the GB of the per-GPU
    # column. Not the name's size: NVIDIA's "80GB" is GiB (85.9 GB), so 83 GB per GPU can fit an "80GB" card.
    cells = [f"{mark}{o.spec.model:<16}", f"{o.usable / GB:>9,.1f}", f"{fit:<12}", f"{_gb(o.memory.total):>10}"]
    cells.append(f"{o.largest_batch:>9}" if o.fits else f"{'-':>9}")
    if time:
        cells.append(f"{time['step_s']:>8.3f}")
        cost = time.get("epoch_cost", time.get("per_million_samples"))
        hours = time.get("epoch_hours")
        cells.append(f"{hours:>8.2f}" if hours is not None else f"{'':>8}")
        cells.append(f"{'$' + format(cost, ',.2f'):>10}" if cost is not None else "")
    elif not o.fits:
        cells.append(o.why)
    return "  ".join(cells).rstrip()


def render_plan(p: PlanResult) -> str:
    m, s = p.model, p.setup
    st = states(m, s)
    ckpt = s.checkpointing and m.checkpointed is not None
    line = m.checkpointed if ckpt and m.checkpointed is not None else m.activations
    lines = [
        f"gpu-preflight plan: {m.name}, {m.parameters:,} parameters ({st.trainable:,} trained), {s.method} with "
        f"{s.optimizer}, {s.precision} precision{', checkpointing' if s.checkpointing else ''}, micro-batch {p.batch}",
        f"  sizes: {m.source}",
        f"  activations{' (checkpointed)' if ckpt else ''}: {_gb(line.fixed)} + {_gb(line.per_sample)} per sample",
    ]
    lines += [f"  note: {n}" for n in (*m.notes, *p.notes)]
    fitting = [o for o in p.options if o.fits]
    if fitting:
        o = fitting[0]
        terms = ", ".join(f"{k.replace('_', ' ')} {_gb(v)}" for k in TERMS if (v := getattr(o.memory, k)))
        how = f"{o.gpus} x {o.sharding}" if o.gpus > 1 else "1 GPU"
        lines.append(f"  per GPU on {o.spec.model} ({how}): {terms}; total {_gb(o.memory.total)}")
    head = f"  {'card':<17}  {'usable GB':>9}  {'fits':<12}  {'per GPU':>10}  {'max batch':>9}"
    if p.times:
        unit = "epoch $" if any("epoch_cost" in t for t in p.times.values()) else "$ / 1M"
        head += f"  {'step s':>8}  {'epoch h':>8}  {unit:>10}"
    lines += ["", head]
    lines += ["  " + _row(o, p.times.get(o.spec.model)) for o in p.options]
    lines.append("  usable GB: what one card holds, in the per-GPU column's GB (10^9 bytes); a card's \"80GB\" is GiB")
    if p.box:
        lines.append(f"  * this box ({p.box[0]}): its free memory, {_gb(p.box[1])} ({p.box[1] / GIB:,.1f} GiB)")
    lines.append("")
    lines.append(summary(p))
    return "\n".join(lines) + "\n"


def summary(p: PlanResult) -> str:
    """The one line: the cheapest option that fits, or the smallest one that does, or that none does."""
    fitting = [o for o in p.options if o.fits]
    if not fitting:
        return "nothing fits: try --checkpointing, --method lora/qlora, a smaller --batch-size or more --gpus"
    if p.cheapest:
        o = next(o for o in fitting if o.spec.model == p.cheapest)
        t = p.times[o.spec.model]
        cost = (
            f"{money(t['epoch_cost'])} per epoch"
            if "epoch_cost" in t
            else f"{money(t['per_million_samples'])} per 1M samples"
        )
        return f"cheapest that fits: {o.gpus} x {o.spec.model} ({o.sharding}), {cost}"
    o = fitting[0]
    how = f" ({o.sharding})" if o.gpus > 1 else ""
    return (
        f"fits on {o.gpus} x {o.spec.model}{how}, micro-batch up to {o.largest_batch}; {len(fitting)} card classes fit"
    )
