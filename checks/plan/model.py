"""The model's sizes: parameter counts and activation bytes as a linear function of the micro-batch.

Three sources, one record. ``from_measurement`` reads the child's result (meta device, saved-for-backward bytes
at two batch sizes: a straight line through them). ``transformer`` is the analytic form for ``--params/--layers
...`` and ``--hf-config`` without transformers: parameters from the shapes, activations per layer from
Korthikanti et al. 2022 (docs/sources.md#activation-memory): attention 11sbh + 5as²b (a fused kernel
instead: a b·a·s fp32 logsumexp), MLP 2sbh input + 1sbh dropout mask + 4sbi (GeLU input and fc2 input; 8sbi for
a gated MLP's gate, activation, up and product), two LayerNorms 4sbh; with 4h GeLU that is sbh(34 + 5as/h).
Logits add b·s·V x 6 bytes (16-bit plus the fp32 copy the loss makes, docs/sources.md#activation-memory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.errors import PreflightError


@dataclass(frozen=True)
class Line:
    """Bytes = fixed + per_sample x micro-batch."""

    fixed: float
    per_sample: float

    def at(self, batch: int) -> float:
        return self.fixed + self.per_sample * batch

    @classmethod
    def through(cls, b1: int, y1: float, b2: int, y2: float) -> Line:
        slope = (y2 - y1) / (b2 - b1)
        return cls(max(0.0, y1 - slope * b1), slope)


@dataclass(frozen=True)
class ModelSize:
    name: str
    source: str  # how the figures were obtained, shown in the output
    parameters: int
    linear_weight_parameters: int  # weights of Linear layers: what LoRA adapts and QLoRA quantises
    lora_per_rank: int  # sum of (d_in + d_out) over the Linear layers: LoRA trainable params = r x this
    largest_block_parameters: int  # FSDP/ZeRO-3 gathers one block at a time
    small_tensor_parameters: int = 0  # in tensors under 4096 elements (8-bit Adam keeps them 32-bit)
    activations: Line = Line(0.0, 0.0)  # saved for backward + the output, in the compute dtype
    checkpointed: Line | None = None  # with the blocks checkpointed, the one block being recomputed included
    blocks: int = 0
    notes: tuple[str, ...] = field(default=())


def from_measurement(data: dict[str, Any]) -> ModelSize:
    """The child's JSON (checks/plan/scripts/measure_model.py) as a ModelSize."""
    m = data["model"]
    b1, b2 = data["batches"]
    rows = data["rows"]
    acts = Line.through(b1, rows[0]["saved"] + rows[0]["output"], b2, rows[1]["saved"] + rows[1]["output"])
    ckpt = None
    if data.get("checkpointed"):
        c = data["checkpointed"]
        block = Line.through(b1, rows[0]["largest_block"], b2, rows[1]["largest_block"])
        line = Line.through(b1, c[0]["saved"] + c[0]["output"], b2, c[1]["saved"] + c[1]["output"])
        ckpt = Line(line.fixed + block.fixed, line.per_sample + block.per_sample)
    where = "the meta device" if data["device"] == "meta" else "the CPU"
    notes = [data["fallback"]] if data.get("fallback") else []
    return ModelSize(
        name=m["name"],
        source=f"measured on {where} ({data['dtype']}, batches {b1} and {b2}, torch {data.get('torch')})",
        parameters=int(m["parameters"]),
        linear_weight_parameters=int(m["linear_weight_parameters"]),
        lora_per_rank=int(m["lora_per_rank"]),
        largest_block_parameters=int(m["largest_block_parameters"]),
        small_tensor_parameters=int(m["small_tensor_parameters"]),
        activations=acts,
        checkpointed=ckpt,
        blocks=int(m["blocks"]),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer, as config.json or the analytic flags describe it."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 0
    kv_heads: int = 0  # 0: = heads (no grouped-query attention)
    intermediate: int = 0  # 0: 4 x hidden
    gated: bool = False  # SwiGLU-style MLP (gate, up, down)
    tied: bool = True  # the output head shares the embedding
    bias: bool = False  # Linear layers with biases (GPT-2, GPT-NeoX, OPT); Llama-style models have none
    name: str = "transformer"


def transformer_parameters(s: Shape) -> tuple[int, int, int, int]:
    """(all parameters, Linear weights, LoRA params per rank, one block's parameters) from the shapes."""
    h, i = s.hidden, s.intermediate or 4 * s.hidden
    kv = h * (s.kv_heads or s.heads) // s.heads
    attn_shapes = [(h, h), (h, kv), (h, kv), (h, h)]
    mlp_shapes = [(h, i), (h, i), (i, h)] if s.gated else [(h, i), (i, h)]
    linear = sum(a * b for a, b in attn_shapes + mlp_shapes)
    biases = sum(b for _, b in attn_shapes + mlp_shapes) if s.bias else 0
    block = linear + biases + 4 * h  # two norms (weight + bias)
    lora = s.layers * sum(a + b for a, b in attn_shapes + mlp_shapes)
    embed = s.vocab * h
    head = 0 if s.tied else s.vocab * h
    total = s.layers * block + embed + head + 2 * h
    return total, s.layers * linear + head, lora + (s.vocab + h if head else 0), block


def layer_activation_bytes(s: Shape, flash: bool) -> tuple[float, float]:
    """Korthikanti's per-layer bytes per sample in 16-bit: (whole layer, its checkpointed input 2sh)."""
    sh, h, i = s.seq * s.hidden, s.hidden, s.intermediate or 4 * s.hidden
    attention = 11 * sh + (4 * s.heads * s.seq if flash else 5 * s.heads * s.seq * s.seq)
    mlp = 3 * sh + (8 if s.gated else 4) * s.seq * i
    del h
    return attention + mlp + 4 * sh, 2 * sh


def transformer(s: Shape, params: int | None, flash: bool, dtype_bytes: int, source: str) -> ModelSize:
    """A ModelSize from the shapes; ``params`` (the --params figure) overrides the count from the shapes."""
    total, linear, lora, block = transformer_parameters(s)
    notes = []
    if params is not None:
        if abs(params - total) > 0.1 * params:
            notes.append(f"--params {params:,} differs from {total:,} counted from the shapes; --params is used")
        scale = params / total
        total, linear, block = params, round(linear * scale), round(block * scale)
    layer, kept = layer_activation_bytes(s, flash)
    scale16 = dtype_bytes / 2  # the formula counts 16-bit tensors
    logits = s.seq * s.vocab * 6 if s.vocab else 0.0
    if not s.vocab:
        notes.append("no vocabulary size: the logits are not counted")
    per_sample = s.layers * layer * scale16 + logits
    ckpt = s.layers * kept * scale16 + layer * scale16 + logits
    attn = "a fused attention kernel (no s x s scores)" if flash else "attention as written (s x s scores kept)"
    return ModelSize(
        name=s.name,
        source=f"{source}; activations from Korthikanti et al. 2022 with {attn}",
        parameters=total,
        linear_weight_parameters=linear,
        lora_per_rank=lora,
        largest_block_parameters=block,
        activations=Line(0.0, per_sample),
        checkpointed=Line(0.0, ckpt),
        blocks=s.layers,
        notes=tuple(notes),
    )


_FIELDS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "seq": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "vocab": ("vocab_size",),
}


_BIASED = ("gpt2", "gpt_neox", "gptj", "opt", "bloom", "gpt_bigcode")


def read_hf_config(path: Path) -> dict[str, Any]:
    """config.json (or the folder holding it) as a dict; an unreadable file is a usage error."""
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PreflightError(f"--hf-config {file}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PreflightError(f"--hf-config {file}: not a JSON object")
    return data


def hf_seq(data: dict[str, Any], seq: int) -> int:
    """The sequence a config.json model is planned at: ``--seq``, else its maximum positions (0: neither)."""
    if seq:
        return seq
    return next((int(data[n]) for n in _FIELDS["seq"] if isinstance(data.get(n), int) and data[n] > 0), 0)


def shape_from_hf(data: dict[str, Any], seq: int, where: str) -> Shape:
    """A transformer's Shape from config.json fields; missing ones are named (exit 2)."""
    got: dict[str, int] = {}
    for key, names in _FIELDS.items():
        value = next((data[n] for n in names if isinstance(data.get(n), int)), None)
        if value is not None:
            got[key] = value
    if seq:
        got["seq"] = seq
    missing = [f"{k} ({' / '.join(_FIELDS[k])})" for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in got]
    if missing:
        raise PreflightError(
            f"--hf-config {where} lacks {', '.join(missing)}",
            hint="give a decoder transformer's config.json, or --params/--layers/--hidden/--heads/--seq/--vocab",
        )
    act = str(data.get("hidden_act") or data.get("activation_function") or "")
    return Shape(
        layers=got["layers"],
        hidden=got["hidden"],
        heads=got["heads"],
        seq=got["seq"],
        vocab=got["vocab"],
        kv_heads=int(data.get("num_key_value_heads") or 0),
        intermediate=int(data.get("intermediate_size") or data.get("n_inner") or 0),
        gated=act in ("silu", "swiglu", "swish"),
        tied=bool(data.get("tie_word_embeddings", True)),
        bias=bool(data.get("attention_bias", data.get("model_type") in _BIASED)),
        name=str(data.get("model_type") or (data.get("architectures") or ["transformer"])[0]),
    )


def check_shape(s: Shape) -> None:
    given = (("--layers", s.layers), ("--hidden", s.hidden), ("--heads", s.heads), ("--seq", s.seq))
    missing = [flag for flag, value in given if value == 0]  # 0 is each flag's default: not given
    if missing:
        raise PreflightError(
            f"the model's shape needs {', '.join(missing)} (not given, or 0)",
            hint="give all of --layers --hidden --heads --seq, or --hf-config with a model's config.json",
        )
    for flag, value in given:
        if not 1 <= value <= 1 << 24:
            raise PreflightError(f"{flag} {value} is out of range (1 to {1 << 24})")
    if s.hidden % s.heads:
        raise PreflightError(f"--hidden {s.hidden} is not a multiple of --heads {s.heads}")
