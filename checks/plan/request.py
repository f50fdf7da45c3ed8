"""The request ``invoke plan`` builds from its flags, and the checks of its values (bad input: one line, exit 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from checks.config import PreflightConfig
from checks.errors import PreflightError

METHODS = ("full", "lora", "qlora")
OPTIMIZERS = ("adamw", "sgd", "adam8bit")
PRECISIONS = ("mixed", "bf16", "fp32")
SHARDINGS = ("auto", "ddp", "zero1", "zero2", "zero3", "fsdp")
ATTENTIONS = ("flash", "as-written")
MAX_PARAMS = 10e12  # 10 T: a size beyond any model trained so far is a typo
_COUNT = re.compile(r"^\s*(?P<num>\d+(\.\d*)?([eE][+-]?\d+)?)\s*(?P<unit>[kKmMbBtT]?)\s*$")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for. Exactly one of ``model``, ``hf_config`` and ``params`` names the model."""

    config: PreflightConfig
    model: str = ""  # MODULE:CALLABLE (verify's convention), imported from user_path
    input_shape: str = ""  # one sample's input, "3x224x224" or "512"
    input_dtype: str = "float"  # float or long (token ids)
    dataset: str = ""  # MODULE:CALLABLE whose first item's input gives the shape and dtype
    hf_config: str = ""  # a local config.json (or its folder)
    params: str = ""  # analytic: "7B", "1.3e9", "350M"
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    seq: int = 0
    vocab: int = 0
    method: str = "full"
    optimizer: str = "adamw"
    precision: str = "mixed"
    lora_rank: int = 0  # 0: preflight.plan.lora_rank
    batch_size: int = 1  # micro-batch per GPU that must fit
    gpus: int = 0  # 0: the fewest that fit
    sharding: str = "auto"
    checkpointing: bool = False
    attention: str = "flash"
    from_report: str = ""  # a verify JSON report of this model
    epoch_samples: int = 0
    machine: str = ""  # a snapshot: its GPU is "this box"
    json: str = ""
    user_path: Path = field(default_factory=Path.cwd)


def parse_count(text: str, flag: str = "--params") -> int:
    """'7B', '1.3e9', '350M' -> an integer count; anything else or an absurd size is a usage error."""
    m = _COUNT.match(text)
    if not m:
        raise PreflightError(f"{flag} {text!r} is not a count", hint="write it as 7B, 1.3e9 or 350M")
    value = float(m["num"]) * _UNITS[m["unit"].lower()]
    if not 1 <= value <= MAX_PARAMS:
        raise PreflightError(f"{flag} {text!r} is outside 1 .. 10T parameters", hint="check the unit (K, M, B, T)")
    return round(value)


def parse_shape(text: str) -> list[int]:
    """'3x224x224' or '3,224,224' -> [3, 224, 224] (one sample, no batch dimension)."""
    parts = [p for p in re.split(r"[x,\s]+", text.strip().lower()) if p]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise PreflightError(f"--input-shape {text!r} is not a shape", hint="one sample's shape, e.g. 3x224x224 or 512")
    return [int(p) for p in parts]


def _one_of(flag: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise PreflightError(f"{flag} {value!r} is not one of {', '.join(allowed)}")


def check(r: PlanRequest) -> None:
    """Refuse a request that cannot be planned, naming the flag and what to give instead."""
    given = [f for f, v in (("--model", r.model), ("--hf-config", r.hf_config), ("--params", r.params)) if v]
    if len(given) != 1:
        raise PreflightError(
            "plan needs exactly one model: " + (f"{' and '.join(given)} given" if given else "none given"),
            hint="--model MODULE:CALLABLE --input-shape 3x224x224, --hf-config config.json, or --params 7B --layers ...",
        )
    choices: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("--method", r.method, METHODS),
        ("--optimizer", r.optimizer, OPTIMIZERS),
        ("--precision", r.precision, PRECISIONS),
        ("--sharding", r.sharding, SHARDINGS),
        ("--attention", r.attention, ATTENTIONS),
        ("--input-dtype", r.input_dtype, ("float", "long")),
    )
    for flag, choice, allowed in choices:
        _one_of(flag, choice, allowed)
    for flag, value, top in (
        ("--batch-size", r.batch_size, 1 << 20),
        ("--gpus", r.gpus, 1 << 16),
        ("--lora-rank", r.lora_rank, 1 << 16),
        ("--epoch-samples", r.epoch_samples, 1 << 50),
    ):
        if value < 0 or value > top or (flag == "--batch-size" and value == 0):
            raise PreflightError(f"{flag} {value} is out of range (expected 1 .. {top})")
    if r.method == "qlora" and r.precision == "fp32":
        raise PreflightError("--method qlora computes in 16-bit: use --precision mixed or bf16")
    if r.model and not (r.input_shape or r.dataset):
        raise PreflightError("--model needs a sample: give --input-shape (e.g. 3x224x224) or --dataset MODULE:CALLABLE")
