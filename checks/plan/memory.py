"""Training memory per GPU, term by term (docs/sources.md#zero-model-states).

Model states per parameter (ZeRO, Rajbhandari et al. 2020, docs/sources.md#zero-model-states): mixed precision keeps 16-bit weights (2 B) and
grads (2 B), an fp32 master copy (4 B) and the optimizer's state: AdamW two fp32 moments (8 B), SGD with momentum
one (4 B), 8-bit Adam 2 B (Dettmers et al. 2021; tensors under 4096 elements keep 8 B). ``fp32`` has 4 B weights
and grads and no master; ``bf16`` keeps everything in 16-bit (AdamW moments 4 B). LoRA (Hu et al. 2021) trains
r x (d_in + d_out) per Linear layer, the base frozen in the compute dtype; QLoRA (Dettmers et al. 2023) stores
the Linear weights in NF4 with double quantisation, 0.516 B per parameter (docs/sources.md#qlora).

Across N GPUs (docs/sources.md#zero-model-states): DDP keeps all of it (and, with PyTorch's default gradient_as_bucket_view=False, a second
copy of the grads in its buckets: docs/sources.md#ddp-exposed-comm); ZeRO-1 shards the optimizer and master (4Ψ + 12Ψ/N), ZeRO-2 the
grads too (2Ψ + 14Ψ/N), ZeRO-3 / FSDP full shard everything (16Ψ/N) plus the block being gathered and the next
one prefetched (2 x the largest block's 16-bit weights, derived). Fixed costs come from ``preflight.plan``.
"""

from __future__ import annotations

from dataclasses import dataclass

from checks.config import PlanConfig
from checks.plan.model import ModelSize
from checks.units import MIB

QLORA_BYTES = 0.516  # NF4 + double-quantised constants: 4.127 bits (docs/sources.md#qlora, QLoRA pp. 5-6)
OPTIMIZER_BYTES = {"adamw": 8.0, "sgd": 4.0, "adam8bit": 2.0}
SHARD_ORDER = ("ddp", "zero1", "zero2", "zero3")  # least communication first


@dataclass(frozen=True)
class Setup:
    method: str = "full"
    optimizer: str = "adamw"
    precision: str = "mixed"
    lora_rank: int = 16
    checkpointing: bool = False

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class States:
    """Model-state bytes for the whole model (before sharding)."""

    trainable: int
    weights: float
    grads: float
    master: float
    optimizer: float


def _optimizer_bytes(setup: Setup, params: int, small: int) -> float:
    per = OPTIMIZER_BYTES[setup.optimizer]
    if setup.optimizer == "adam8bit":
        return per * (params - small) + 8.0 * small
    return per * params / (2 if setup.precision == "bf16" else 1)  # bf16: moments in the params' dtype


def states(m: ModelSize, setup: Setup) -> States:
    w = setup.dtype_bytes
    master = 4.0 if setup.precision == "mixed" else 0.0
    if setup.method == "full":
        p, small = m.parameters, m.small_tensor_parameters
        return States(p, w * p, w * p, master * p, _optimizer_bytes(setup, p, small))
    t = setup.lora_rank * m.lora_per_rank
    if setup.method == "qlora":
        base = QLORA_BYTES * m.linear_weight_parameters + w * (m.parameters - m.linear_weight_parameters)
    else:
        base = float(w * m.parameters)
    return States(t, base + w * t, w * t, master * t, _optimizer_bytes(setup, t, 0))


@dataclass(frozen=True)
class Breakdown:
    """Bytes per GPU, each term (shown as is in the output)."""

    weights: float
    grads: float
    master: float
    optimizer: float
    ddp_buckets: float
    gathered: float
    activations: float
    cuda_context: float
    nccl: float
    fragmentation: float

    @property
    def total(self) -> float:
        return sum(vars(self).values())

    def as_dict(self) -> dict[str, float]:
        return {k: round(v) for k, v in vars(self).items()} | {"total": round(self.total)}


def per_gpu(m: ModelSize, setup: Setup, cfg: PlanConfig, batch: int, gpus: int, sharding: str) -> Breakdown:
    s = states(m, setup)
    n = max(gpus, 1)
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, n), "zero2": (1, n, n), "zero3": (n, n, n)}[sharding]
    gathered = 2.0 * setup.dtype_bytes * m.largest_block_parameters if sharding == "zero3" and n > 1 else 0.0
    line = m.checkpointed if setup.checkpointing and m.checkpointed is not None else m.activations
    acts = line.at(batch)
    buckets = s.grads if sharding == "ddp" and n > 1 else 0.0
    dynamic = (
        s.weights / shard[0] + s.grads / shard[1] + (s.master + s.optimizer) / shard[2] + buckets + gathered + acts
    )
    return Breakdown(
        weights=s.weights / shard[0],
        grads=s.grads / shard[1],
        master=s.master / shard[2],
        optimizer=s.optimizer / shard[2],
        ddp_buckets=buckets,
        gathered=gathered,
        activations=acts,
        cuda_context=cfg.cuda_context_mib * MIB,
        nccl=cfg.nccl_mib * MIB if n > 1 else 0.0,
        fragmentation=cfg.fragmentation_fraction * dynamic,
    )


def largest_batch(m: ModelSize, setup: Setup, cfg: PlanConfig, usable: float, gpus: int, sharding: str) -> int:
    """The largest micro-batch whose total fits in ``usable`` bytes (0: not even one sample)."""
    zero = per_gpu(m, setup, cfg, 0, gpus, sharding)
    line = m.checkpointed if setup.checkpointing and m.checkpointed is not None else m.activations
    per_sample = line.per_sample * (1 + cfg.fragmentation_fraction)
    if zero.total > usable:
        return 0
    if per_sample <= 0:
        return 1 << 20
    return min(int((usable - zero.total) // per_sample), 1 << 20)
