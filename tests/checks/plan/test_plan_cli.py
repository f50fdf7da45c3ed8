"""``invoke plan`` through the real task and hooks: the measuring child runs real torch on the meta device over the
models of plan_models.py (imported from this folder, as a user's own module would be)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cli import Here, assert_usage_error
from tests.fakes.plan import SEVEN_B, plan

pytestmark = pytest.mark.slow
GOLDEN = Path(__file__).resolve().parents[1] / "verify" / "golden"  # verify reports as the code writes them


def option(doc: dict[str, Any], card: str) -> dict[str, Any]:
    return next(o for o in doc["options"] if o["card"] == card)


def verify_report(tmp: Path, card: str, parameters: int, shares: dict[str, float], samples_s: float = 100.0) -> str:
    """A whole verify report (a golden one of ``tests/checks/verify``) with this card, model and figures."""
    golden = json.loads((GOLDEN / "a100-fragmented.json").read_text(encoding="utf-8"))
    m = golden["measurements"]
    m["run"] |= {"device": {"type": "cuda", "name": card}, "precision": "bf16", "model": {"name": "GPT", "parameters": parameters}}  # fmt: skip
    m |= {"step_breakdown": shares, "samples_per_s": samples_s}
    doc = {"schema": 1, "tool": "gpu-preflight", "host": "box-a", "machine": "live", "results": golden["results"]}
    path = tmp / f"verify-{parameters}.json"
    path.write_text(json.dumps(doc | {"measurements": m}))
    return str(path)


def test_measured_gpt_counts_every_parameter_and_its_activations_grow_with_the_batch(
    here: Here, tmp_path: Path
) -> None:
    run, doc = plan(here, tmp_path, "--model", "plan_models:gpt", "--input-shape", "128", "--input-dtype", "long")
    assert run.code == 0, run.why()
    import torch

    from tests.checks.plan import plan_models

    assert doc["model"]["parameters"] == sum(p.numel() for p in plan_models.gpt().parameters())
    acts = doc["model"]["activations"]
    assert acts["per_sample_bytes"] > 1e6 and acts["fixed_bytes"] < 0.01 * acts["per_sample_bytes"]
    h100 = option(doc, "H100 SXM5")
    assert h100["fits"] and h100["gpus"] == 1 and h100["memory"]["weights"] == 2 * doc["model"]["parameters"]
    assert h100["memory"]["optimizer"] == 8 * doc["model"]["parameters"]
    assert "memory only" in run.out and "H100 SXM5" in run.out
    del torch


def test_tiny_cnn_activations_match_the_tensors_counted_by_hand(here: Here, tmp_path: Path) -> None:
    """conv saves its bf16 input (3x16x16x2 B), ReLU its output (8x16x16x2 B; flatten and the linear's input are
    views of it), plus the 10 bf16 logits: 1,536 + 4,096 + 20 = 5,652 bytes per sample."""
    run, doc = plan(here, tmp_path, "--model", "plan_models:tiny_cnn", "--input-shape", "3x16x16")
    assert run.code == 0, run.why()
    assert doc["model"]["activations"] == {"fixed_bytes": 0, "per_sample_bytes": 5652}


def test_checkpointing_keeps_less_than_the_full_forward(here: Here, tmp_path: Path) -> None:
    args = ("--model", "plan_models:resnet50", "--input-shape", "3x224x224", "--batch-size", "32")
    _, full = plan(here, tmp_path, *args)
    _, ckpt = plan(here, tmp_path, *args, "--checkpointing")
    a, b = option(full, "RTX 4090")["memory"]["activations"], option(ckpt, "RTX 4090")["memory"]["activations"]
    assert 0 < b < 0.6 * a
    assert full["model"]["parameters"] == 25_557_032  # torchvision's resnet50


def test_a_model_that_reads_values_falls_back_to_the_cpu_and_says_so(here: Here, tmp_path: Path) -> None:
    run, doc = plan(here, tmp_path, "--model", "plan_models:data_dependent", "--input-shape", "16")
    assert run.code == 0, run.why()
    assert any("measured on the CPU" in n and "item()" in n for n in doc["model"]["notes"])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--model", "plan_models:broken", "--input-shape", "16"), ("weights file missing",)),
        (("--model", "plan_models:needs_size", "--input-shape", "16"), ("needs arguments", "size")),
        (("--model", "no_such_module:make", "--input-shape", "16"), ("cannot load", "no_such_module")),
        (("--model", "plan_models:gpt"), ("--input-shape",)),
        (("--params", "7X", "--layers", "2"), ("--params", "7X")),
        (("--params", "900T", "--layers", "2"), ("outside",)),
        (("--params", "7B", "--layers", "32"), ("--hidden",)),
        (("--params", "7B", "--hf-config", "x.json"), ("exactly one model",)),
        ((*SEVEN_B, "--method", "dora"), ("--method", "dora")),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    here: Here, tmp_path: Path, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    run, _ = plan(here, tmp_path, *args)
    assert_usage_error(run, *needles)


def test_hf_config_lacking_fields_names_them(here: Here, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    run, _ = plan(here, tmp_path, "--hf-config", str(tmp_path))
    assert_usage_error(run, "num_hidden_layers", "vocab_size")


def test_hf_config_of_a_llama_7b(here: Here, tmp_path: Path) -> None:
    """Llama-2-7B's 6,738,415,616 parameters: built on meta by transformers, or from the config.json fields."""
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
           "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    run, doc = plan(here, tmp_path, "--hf-config", str(tmp_path / "config.json"), "--seq", "2048")
    assert run.code == 0, run.why()
    from_fields = any("sizes from the config's fields" in n for n in doc["model"]["notes"])  # no transformers
    rmsnorm_has_no_bias = 32 * 2 * 4096 + 4096 if from_fields else 0  # the formula counts LayerNorm's bias too
    assert doc["model"]["parameters"] - rmsnorm_has_no_bias == 6_738_415_616
    assert not option(doc, "RTX 4090")["fits"] or option(doc, "RTX 4090")["gpus"] > 1


def test_seven_b_full_fine_tune_needs_sharding_on_80_gb_and_fits_one_h200(here: Here, tmp_path: Path) -> None:
    run, doc = plan(here, tmp_path, *SEVEN_B, "--checkpointing")
    assert run.code == 0, run.why()
    h200, a100 = option(doc, "H200 SXM"), option(doc, "A100 80GB SXM4")
    assert (h200["gpus"], h200["sharding"]) == (1, "ddp")
    assert a100["gpus"] > 1 and a100["sharding"] in ("zero1", "zero2", "zero3")
    assert h200["memory"]["master"] == 4 * 7e9 and h200["memory"]["optimizer"] == 8 * 7e9


def test_prices_rank_the_cards_and_name_the_cheapest(here: Here, tmp_path: Path) -> None:
    parameters = 124_439_808
    gpt2 = (
        "--params",
        str(parameters),
        "--layers",
        "12",
        "--hidden",
        "768",
        "--heads",
        "12",
        "--seq",
        "1024",
        "--vocab",
        "50257",
    )
    shares = {"data_wait": 0.1, "h2d": 0.0, "forward": 0.3, "backward": 0.5, "optimizer": 0.1, "checkpoint": 0.0}
    report = verify_report(tmp_path, "NVIDIA A100-SXM4-80GB", parameters, shares)
    prices = {"A100 80GB SXM4": 1.5, "H100 SXM5": 2.5, "RTX 4090": 0.4}
    run, doc = plan(here, tmp_path, *gpt2, "--from", report, "--epoch-samples", "1000000", config={"prices": prices})
    assert run.code == 0, run.why()
    a100, h100 = option(doc, "A100 80GB SXM4")["time"], option(doc, "H100 SXM5")["time"]
    assert a100["samples_per_s"] == pytest.approx(100.0)  # the report's own card: unchanged
    # 80% of the time scales with the peak (312 -> 989), the optimizer's 10% with bandwidth (2039 -> 3350)
    expected = 0.01 * (0.1 + 0.8 * 312 / 989 + 0.1 * 2039 / 3350)
    assert 1 / h100["samples_per_s"] == pytest.approx(expected)
    costs = [o["time"]["epoch_cost"] for o in doc["options"] if o["time"] and "epoch_cost" in o["time"]]
    assert costs == sorted(costs) and len(costs) == 3
    assert doc["cheapest"] == doc["options"][0]["card"]
    assert f"cheapest that fits: 1 x {doc['cheapest']}" in run.out


def test_prices_with_an_unknown_card_suggest_the_closest(here: Here, tmp_path: Path) -> None:
    run, _ = plan(here, tmp_path, *SEVEN_B, config={"prices": {"H100 SXM": 2.5}})
    assert_usage_error(run, "H100 SXM", "did you mean 'H100 SXM5'")


def test_a_report_of_another_model_or_from_the_cpu_is_refused(here: Here, tmp_path: Path) -> None:
    report = verify_report(tmp_path, "NVIDIA A100-SXM4-80GB", 1_000_000, {"forward": 1.0})
    assert_usage_error(plan(here, tmp_path, *SEVEN_B, "--from", report)[0], "another model", "1,000,000")
    cpu = json.loads(Path(report).read_text())
    cpu["measurements"]["run"]["device"] = {"type": "cpu", "name": "cpu"}
    Path(report).write_text(json.dumps(cpu))
    assert_usage_error(plan(here, tmp_path, *SEVEN_B, "--from", report)[0], "on the CPU")


def test_this_boxs_free_memory_is_also_given_in_the_units_of_the_card_column(here: Here, tmp_path: Path) -> None:
    snapshot = Path(__file__).resolve().parents[2] / "fixtures" / "machines" / "rtx4090-power-capped.json"
    args = ("plan", "--params", "1B", "--layers", "16", "--hidden", "2048", "--heads", "16", "--seq", "1024")
    run = here(tmp_path, *args, "--machine", str(snapshot))
    assert run.code == 0, run.why()
    box = next(line for line in run.out.splitlines() if "this box" in line)
    assert box.strip() == "* this box (RTX 4090): its free memory, 25.8 GB (24.0 GiB)"  # the 24 of the GB column
