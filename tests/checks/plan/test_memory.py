"""Plan's memory terms against the formulas they come from: ZeRO's per-GPU model states, 8-bit Adam's small
tensors, LoRA's r x (d_in + d_out), QLoRA's 0.516 B per quantised weight, and the largest micro-batch."""

from __future__ import annotations

import pytest

from checks.config import make_config
from checks.plan.memory import Setup, largest_batch, per_gpu, states
from checks.plan.model import Line, ModelSize, Shape, transformer, transformer_parameters

CFG = make_config().plan
PSI = 1_000_000_000


def model(**kw: object) -> ModelSize:
    base: dict[str, object] = dict(
        name="m", source="test", parameters=PSI, linear_weight_parameters=PSI // 2, lora_per_rank=1000,
        largest_block_parameters=0, activations=Line(1e6, 1e8),
    )  # fmt: skip
    return ModelSize(**(base | kw))  # type: ignore[arg-type]


def model_states(n: int, sharding: str) -> float:
    b = per_gpu(model(), Setup(), CFG, 1, n, sharding)
    return b.weights + b.grads + b.master + b.optimizer


@pytest.mark.parametrize(
    ("sharding", "expected"),
    [("zero1", 4 * PSI + 12 * PSI / 8), ("zero2", 2 * PSI + 14 * PSI / 8), ("zero3", 16 * PSI / 8)],
)
def test_zero_stages_follow_the_paper(sharding: str, expected: float) -> None:
    assert model_states(8, sharding) == pytest.approx(expected)


def test_mixed_precision_adam_is_16_bytes_per_parameter_and_ddp_adds_its_buckets() -> None:
    assert model_states(1, "ddp") == 16 * PSI
    one, eight = per_gpu(model(), Setup(), CFG, 1, 1, "ddp"), per_gpu(model(), Setup(), CFG, 1, 8, "ddp")
    assert (one.ddp_buckets, eight.ddp_buckets) == (0, 2 * PSI)
    assert (one.nccl, eight.nccl) == (0, CFG.nccl_mib << 20)


def test_optimizers_and_precisions() -> None:
    m = model(small_tensor_parameters=1000)
    assert states(m, Setup(optimizer="sgd")).optimizer == 4 * PSI
    assert states(m, Setup(optimizer="adam8bit")).optimizer == 2 * (PSI - 1000) + 8 * 1000
    fp32 = states(m, Setup(precision="fp32"))
    assert (fp32.weights, fp32.grads, fp32.master, fp32.optimizer) == (4 * PSI, 4 * PSI, 0, 8 * PSI)
    pure = states(m, Setup(precision="bf16"))
    assert (pure.weights, pure.master, pure.optimizer) == (2 * PSI, 0, 4 * PSI)


def test_lora_trains_rank_times_in_plus_out_and_qlora_quantises_the_linear_weights() -> None:
    lora = states(model(), Setup(method="lora", lora_rank=8))
    assert lora.trainable == 8 * 1000
    assert lora.weights == 2 * PSI + 2 * 8000 and lora.optimizer == 8 * 8000
    q = states(model(), Setup(method="qlora", lora_rank=8))
    assert q.weights == pytest.approx(0.516 * PSI / 2 + 2 * PSI / 2 + 2 * 8000)


def test_zero3_holds_the_gathered_block() -> None:
    b = per_gpu(model(largest_block_parameters=10_000), Setup(), CFG, 1, 4, "zero3")
    assert b.gathered == 2 * 2 * 10_000


def test_largest_batch_is_the_last_that_fits() -> None:
    m, usable = model(parameters=10_000_000), 20e9
    b = largest_batch(m, Setup(), CFG, usable, 1, "ddp")
    assert b > 1
    assert per_gpu(m, Setup(), CFG, b, 1, "ddp").total <= usable < per_gpu(m, Setup(), CFG, b + 1, 1, "ddp").total
    assert largest_batch(model(), Setup(), CFG, 1e9, 1, "ddp") == 0


def test_gpt2_small_parameters_from_its_shapes() -> None:
    """GPT-2 124M: 124,439,808 parameters (tied head) as its Hugging Face checkpoint counts them."""
    total, *_ = transformer_parameters(Shape(12, 768, 12, 1024, 50257, bias=True))
    assert total == 124_439_808 - 1024 * 768  # learned positions are not part of the decoder formula


def test_korthikanti_per_layer_bytes() -> None:
    s = Shape(1, 256, 4, 128)
    eager = transformer(s, None, flash=False, dtype_bytes=2, source="t").activations.per_sample
    assert eager == 128 * 256 * (34 + 5 * 4 * 128 / 256)


def test_a_shape_without_its_flags_names_what_is_missing() -> None:
    from checks.errors import PreflightError
    from checks.plan.model import check_shape

    with pytest.raises(PreflightError) as missing:
        check_shape(Shape(layers=0, hidden=4096, heads=32, seq=0, vocab=32000))
    assert str(missing.value).startswith("gpu-preflight: the model's shape needs --layers, --seq (not given, or 0)")
    with pytest.raises(PreflightError, match=r"^gpu-preflight: --seq -5 is out of range \(1 to 16777216\)"):
        check_shape(Shape(layers=32, hidden=4096, heads=32, seq=-5, vocab=32000))
    check_shape(Shape(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000))  # a whole shape passes
