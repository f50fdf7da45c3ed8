"""``--hf-config``: a tiny config.json written here, built on the meta device by transformers (nothing downloaded)
and measured in plan's child; without transformers, the formula path, said so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.plan.model import layer_activation_bytes, shape_from_hf, transformer_parameters
from checks.plan.run import SCRIPT
from tests.fakes.cli import Here, Run
from tests.fakes.plan import plan

pytestmark = pytest.mark.slow
SEQ = 128
# Llama: RMSNorm, rotary embeddings, grouped-query attention (2 KV heads of 4), SwiGLU, untied head, no dropout.
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": SEQ, "vocab_size": 1000,
         "hidden_act": "silu", "tie_word_embeddings": False}  # fmt: skip
# GPT-2: LayerNorm, biases, Conv1D, dropout 0.1, exact GeLU (the formula's; GPT-2's default gelu_new is a
# Python-written tanh whose five intermediates are all saved).
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": SEQ, "vocab_size": 1000,
        "activation_function": "gelu", "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
# One block measured on meta against Korthikanti's per-layer bytes with a fused attention kernel. The benchmark's
# own hand-written GPT block is +11.9% (BENCHMARKS.md); on transformers 5.24 this Llama block is +15.4% and this
# GPT-2 block +24.1% (why: test_one_block_against_korthikanti), so the bound is 30%: it catches a lost tensor
# (the formula is then no longer below) or a doubled 4h one (+23% alone on top), not drift of a copy or two.
BLOCK_TOLERANCE = 0.30


def write(tmp: Path, cfg: dict[str, Any]) -> Path:
    (tmp / "config.json").write_text(json.dumps(cfg))
    return tmp / "config.json"


@pytest.fixture(scope="module")
def plans() -> dict[str, tuple[Run, dict[str, Any]]]:
    """``plan --hf-config`` runs by model type, shared by the tests that read the same run."""
    return {}


def plan_of(
    here: Here, tmp: Path, plans: dict[str, tuple[Run, dict[str, Any]]], cfg: dict[str, Any]
) -> tuple[Run, dict[str, Any]]:
    """``invoke plan --hf-config`` of ``cfg`` (written into ``tmp``), run once per module for each model type."""
    name = str(cfg["model_type"])
    if name not in plans:
        plans[name] = plan(here, tmp, "--hf-config", str(write(tmp, cfg)))
    return plans[name]


def child(config: Path, attention: str = "flash") -> dict[str, Any]:
    spec = {"hf_config": str(config), "user_path": str(config.parent), "input_shape": [SEQ], "input_dtype": "long",
            "dtype": "bfloat16", "batches": [1, 2], "checkpointing": False, "attention": attention}  # fmt: skip
    out = subprocess.run([sys.executable, str(SCRIPT), json.dumps(spec)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def transformers_count(config: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config, local_files_only=True))
    return int(model.num_parameters())


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_built_on_meta_counts_what_transformers_and_the_formula_count(
    here: Here,
    tmp_path: Path,
    plans: dict[str, tuple[Run, dict[str, Any]]],
    cfg: dict[str, Any],
) -> None:
    pytest.importorskip("transformers")
    config = write(tmp_path, cfg)
    run, doc = plan_of(here, tmp_path, plans, cfg)
    assert run.code == 0, run.why()
    model = doc["model"]
    assert model["source"].startswith("measured on the meta device"), model
    assert any("built from config.json by transformers, sequence 128" in n for n in model["notes"])
    assert model["parameters"] == transformers_count(config)
    shape = shape_from_hf(cfg, 0, "test")
    h, layers = shape.hidden, shape.layers
    formula = transformer_parameters(shape)[0]
    rmsnorm_has_no_bias = (2 * layers + 1) * h  # the formula counts LayerNorm's weight and bias
    assert model["parameters"] == formula - (rmsnorm_has_no_bias if cfg is LLAMA else -SEQ * h)  # GPT-2: wpe


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_one_block_against_korthikanti(tmp_path: Path, cfg: dict[str, Any]) -> None:
    """Per sample, one decoder block's saved bytes within BLOCK_TOLERANCE over s·h·(34 + ...) (flash).

    Above the formula, as counted on transformers 5.24: Llama's RMSNorm saves its fp32 upcast (4sh) besides
    its 16-bit output, twice per block (+8sh), and RoPE's tables and rotate_half copy, less the two dropout masks
    Llama does not have and the smaller k and v of grouped-query attention (the formula assumes full heads); GPT-2's two dropout masks are 16-bit noise tensors on meta (1 B on a GPU: +2sh), and
    both save the attention output again transposed for the output projection (+2sh, as the benchmark found).
    """
    pytest.importorskip("transformers")
    data = child(write(tmp_path, cfg))
    rows = data["rows"]
    measured = rows[1]["largest_block"] - rows[0]["largest_block"]
    formula = layer_activation_bytes(shape_from_hf(cfg, 0, "test"), flash=True)[0]
    assert 0 < measured / formula - 1 < BLOCK_TOLERANCE, (measured, formula)
    if cfg is GPT2:  # Conv1D is GPT-2's Linear: LoRA adapts its 4 per block and the head
        assert data["model"]["linear_layers"] == 2 * 4 + 1


def test_whole_model_per_sample_against_the_formula_path(
    here: Here, tmp_path: Path, plans: dict[str, tuple[Run, dict[str, Any]]]
) -> None:
    """The logits are counted alike (16-bit output + the loss's fp32 log-softmax = the formula's 6 B x s x V)."""
    pytest.importorskip("transformers")
    run, doc = plan_of(here, tmp_path, plans, LLAMA)
    assert run.code == 0, run.why()
    measured = doc["model"]["activations"]["per_sample_bytes"]
    shape = shape_from_hf(LLAMA, 0, "test")
    logits = 6 * SEQ * shape.vocab
    formula = shape.layers * layer_activation_bytes(shape, flash=True)[0] + logits
    assert 0 < measured / formula - 1 < BLOCK_TOLERANCE, (measured, formula)
    assert measured > logits + shape.layers * layer_activation_bytes(shape, flash=True)[0] * 0.9


def test_without_transformers_the_formula_path_is_used_and_said(
    here: Here,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child starts with a ``transformers`` on PYTHONPATH that fails to import, as a missing one does."""
    blocker = tmp_path / "blocker" / "transformers"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(blocker.parent))
    config = write(tmp_path, LLAMA)
    run, doc = plan(here, tmp_path, "--hf-config", str(config))
    assert run.code == 0, run.why()
    note = "transformers cannot be imported (ModuleNotFoundError: No module named 'transformers'): sizes from the config's fields"
    assert note in doc["model"]["notes"]
    assert note in run.out
    assert doc["model"]["source"].startswith("from config.json fields")
    assert doc["model"]["parameters"] == transformer_parameters(shape_from_hf(LLAMA, 0, "test"))[0]


def test_a_config_transformers_cannot_read_falls_back_and_says_why(here: Here, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = write(tmp_path, LLAMA | {"model_type": "no-such-model"})
    run, doc = plan(here, tmp_path, "--hf-config", str(config))
    assert run.code == 0, run.why()
    assert any(n.startswith("transformers cannot read it (") for n in doc["model"]["notes"]), doc["model"]["notes"]
    assert doc["model"]["source"].startswith("from config.json fields")
