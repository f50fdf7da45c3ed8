"""``plan``: the model's sizes, this box's card, every card class of the table, time and cost when a verify
report is given. What the ``invoke plan`` task calls; it prints nothing.

JSON (``--json``), schema 1::

    {"schema": 1, "tool": "gpu-preflight plan", "model": {"name", "source", "parameters", "trainable",
     "activations": {"fixed_bytes", "per_sample_bytes"}, "notes": [...]},
     "setup": {"method", "optimizer", "precision", "lora_rank", "checkpointing", "batch_size"},
     "this_box": {"card", "free_bytes"} | null, "baseline": {...} | null,
     "options": [{"card", "this_box", "fits", "gpus", "sharding", "usable_bytes", "largest_batch",
                  "memory": {term: bytes, ..., "total"}, "why", "time": {"step_s", "samples_per_s",
                  "epoch_hours", "epoch_cost", ...} | null}],
     "cheapest": "card" | null, "notes": [...]}
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checks import TOOL_NAME
from checks.errors import PreflightError
from checks.plan import timing
from checks.plan.cards import Option, option, usable_bytes
from checks.plan.memory import Setup, states
from checks.plan.model import (
    ModelSize,
    Shape,
    check_shape,
    from_measurement,
    hf_seq,
    read_hf_config,
    shape_from_hf,
    transformer,
)
from checks.plan.request import PlanRequest, check, parse_count, parse_shape
from checks.probe.torch import ChildFailed, run_child
from checks.tables import datasheet

SCRIPT = Path(__file__).resolve().parent / "scripts" / "measure_model.py"
SCHEMA = 1
PARAMS_TOLERANCE = 0.01  # a report's parameter count this far from the model's is another model


@dataclass(frozen=True)
class PlanResult:
    model: ModelSize
    setup: Setup
    batch: int
    options: list[Option]
    times: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: timing.Baseline | None = None
    box: tuple[str, float] | None = None  # (card model, free bytes)
    cheapest: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        m, s = self.model, self.setup
        trainable = states(m, s).trainable
        return {
            "schema": SCHEMA,
            "tool": f"{TOOL_NAME} plan",
            "model": {
                "name": m.name,
                "source": m.source,
                "parameters": m.parameters,
                "trainable": trainable,
                "activations": {
                    "fixed_bytes": round(m.activations.fixed),
                    "per_sample_bytes": round(m.activations.per_sample),
                },
                "notes": list(m.notes),
            },
            "setup": vars(s) | {"batch_size": self.batch},
            "this_box": {"card": self.box[0], "free_bytes": round(self.box[1])} if self.box else None,
            "baseline": None
            if self.baseline is None
            else {
                "card": self.baseline.card.model,
                "precision": self.baseline.precision,
                "per_sample_s": self.baseline.per_sample_s,
                "shares": self.baseline.shares,
                "host": self.baseline.host,
            },
            "options": [_option_json(o, self.times.get(o.spec.model)) for o in self.options],
            "cheapest": self.cheapest,
            "notes": list(self.notes),
        }


def _option_json(o: Option, time: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "card": o.spec.model,
        "this_box": o.this_box,
        "fits": o.fits,
        "gpus": o.gpus,
        "sharding": o.sharding,
        "usable_bytes": round(o.usable),
        "largest_batch": o.largest_batch,
        "memory": o.memory.as_dict(),
        "why": o.why or None,
        "time": time,
    }


def measure(r: PlanRequest, dtype: str, ram_bytes: int | None, **spec_extra: Any) -> ModelSize | str:
    """Run the measuring child on ``--model``, or on ``--hf-config`` built by transformers (``spec_extra``).

    Returns why the child could not build a ``--hf-config`` (transformers missing or refusing it) as a string.
    """
    spec = {
        "model": r.model,
        "user_path": str(r.user_path),
        "dataset": r.dataset,
        "input_shape": parse_shape(r.input_shape) if r.input_shape else [],
        "input_dtype": r.input_dtype,
        "dtype": dtype,
        "batches": [1, 2],
        "checkpointing": r.checkpointing,
        "attention": r.attention,
        "ram_bytes": ram_bytes,
    } | spec_extra
    what = r.model or r.hf_config
    try:
        data = run_child([sys.executable, str(SCRIPT), json.dumps(spec)], r.config.plan.measure_timeout_s)
    except ChildFailed as exc:
        raise PreflightError(f"measuring {what} failed: {exc}", code=1) from None
    if "usage" in data:
        raise PreflightError(data["usage"])
    if "unavailable" in data:
        return str(data["unavailable"])
    if "error" in data:
        raise PreflightError(
            f"measuring {what} failed: {data['error']}", hint="the traceback is on stderr of the child", code=1
        )
    return from_measurement(data)


def hf_model_size(r: PlanRequest, setup: Setup, dtype: str, ram_bytes: int | None) -> ModelSize:
    """``--hf-config``: built on meta by transformers and measured when it can, else from the config's fields."""
    path = Path(r.hf_config)
    data = read_hf_config(path)
    file = path / "config.json" if path.is_dir() else path
    seq = hf_seq(data, r.seq)
    built: ModelSize | str = "no sequence length"  # shape_from_hf names the missing fields
    if seq:
        built = measure(r, dtype, ram_bytes, hf_config=str(file.resolve()), input_shape=[seq], input_dtype="long")
    if isinstance(built, ModelSize):
        return replace(built, notes=(*built.notes, f"built from {file.name} by transformers, sequence {seq}"))
    shape = shape_from_hf(data, r.seq, str(path))
    size = transformer(shape, None, r.attention == "flash", setup.dtype_bytes, f"from {file.name} fields")
    return replace(size, notes=(*size.notes, f"{built}: sizes from the config's fields"))


def model_size(r: PlanRequest, setup: Setup, ram_bytes: int | None) -> ModelSize:
    dtype = "float32" if setup.precision == "fp32" else "bfloat16"
    if r.model:
        size = measure(r, dtype, ram_bytes)
        if isinstance(size, str):  # only a --hf-config build can be unavailable: not reached
            raise PreflightError(size, code=1)
        return size
    if r.hf_config:
        return hf_model_size(r, setup, dtype, ram_bytes)
    count = parse_count(r.params)
    shape = Shape(r.layers, r.hidden, r.heads, r.seq, r.vocab, name=f"{r.params} transformer")
    check_shape(shape)
    return transformer(shape, count, r.attention == "flash", setup.dtype_bytes, "analytic (--params and shapes)")


def check_prices(prices: dict[str, float]) -> dict[str, float]:
    """Prices keyed by table model; an unknown name stops with the closest one."""
    models = {s.model.casefold(): s.model for s in datasheet.all_specs()}
    out = {}
    for name, price in prices.items():
        if name.casefold() not in models:
            close = difflib.get_close_matches(name, list(models.values()), n=1, cutoff=0.4)
            raise PreflightError(
                f"preflight.plan.prices names {name!r}, which is not a card of templates/gpus.yaml",
                hint=f"did you mean {close[0]!r}?" if close else "use the model column of templates/gpus.yaml",
            )
        if price < 0:
            raise PreflightError(f"preflight.plan.prices[{name!r}] is negative")
        out[models[name.casefold()]] = float(price)
    return out


def check_baseline(base: timing.Baseline, m: ModelSize, path: str) -> None:
    if base.parameters and abs(base.parameters - m.parameters) > PARAMS_TOLERANCE * m.parameters:
        raise PreflightError(
            f"--from {path} is a report of another model ({base.model}, {base.parameters:,} parameters; "
            f"this one has {m.parameters:,})",
            hint="run invoke verify with the same --model, then plan --from that report",
        )


def plan(r: PlanRequest, box: tuple[str, float] | None = None, ram_bytes: int | None = None) -> PlanResult:
    """Plan ``r``. ``box`` is this machine's card (datasheet model, free bytes), read by the caller's probe."""
    check(r)
    cfg = r.config.plan
    prices = check_prices(cfg.prices)
    setup = Setup(r.method, r.optimizer, r.precision, r.lora_rank or cfg.lora_rank, r.checkpointing)
    m = model_size(r, setup, ram_bytes)
    notes: list[str] = []
    base = timing.read_report(Path(r.from_report)) if r.from_report else None
    if base is not None:
        check_baseline(base, m, r.from_report)
        if box is not None and base.card.model != box[0]:
            notes.append(f"the report was measured on {base.card.model} ({base.host}), not on this box's {box[0]}")
    else:
        notes.append("memory only: a verify report of this model (--from) adds step time and cost per card")
    options = []
    for spec in datasheet.all_specs():
        here = box is not None and spec.model == box[0]
        usable = box[1] if here and box is not None else usable_bytes(spec, cfg)
        o = option(m, setup, cfg, spec, usable, r.batch_size, r.gpus, r.sharding)
        options.append(replace(o, this_box=here))
    times = {}
    if base is not None:
        grads = states(m, setup).grads
        for o in options:
            if o.fits:
                price = prices.get(o.spec.model)
                times[o.spec.model] = timing.epoch(
                    base, o.spec, o.gpus, r.batch_size, grads, o.sharding, r.epoch_samples, price
                )
    options.sort(key=lambda o: _rank(o, times))
    costed = ("epoch_cost", "per_million_samples")
    priced = [o for o in options if o.fits and any(k in times.get(o.spec.model, {}) for k in costed)]
    cheapest = priced[0].spec.model if priced else None
    return PlanResult(m, setup, r.batch_size, options, times, base, box, cheapest, tuple(notes))


def _rank(o: Option, times: dict[str, dict[str, Any]]) -> tuple[Any, ...]:
    t = times.get(o.spec.model, {})
    cost = t.get("epoch_cost", t.get("per_million_samples"))
    return (not o.fits, cost is None, cost or 0.0, o.gpus, o.usable)
