"""Child process of ``invoke plan`` (torch): build the model on the meta device, count its parameters and measure
the bytes autograd saves for backward at two batch sizes. Run by checks/plan/measure.py.

argv[1] is the spec (JSON): ``model`` (MODULE:CALLABLE), ``user_path``, ``input_shape`` (one sample, no batch
dimension) and ``input_dtype`` ("float" or "long"), or ``dataset`` (MODULE:CALLABLE: the first item's input
gives both), or ``hf_config`` (a local config.json or its folder, built with transformers' AutoModelForCausalLM;
``input_shape`` is then ``[seq]`` of token ids), ``dtype`` (the compute dtype: bfloat16, float16, float32),
``batches`` (two sizes), ``checkpointing``, ``attention`` ("flash": scaled_dot_product_attention saves q, k, v, the output and a b·a·s
fp32 logsumexp, as the GPU kernels do; "as-written": whatever the meta math path saves), ``ram_bytes``.
Prints one JSON object on its last line: ``{"usage": ...}`` for a model that cannot be loaded or built,
``{"unavailable": ...}`` when transformers cannot be imported or cannot build the config (the parent then sizes
the model from the config's fields).

Measuring on meta (docs/sources.md#meta-activations): ``saved_tensors_hooks`` sees every saved tensor;
views share storage and Linear saves its weight, so bytes are summed once per storage
(``untyped_storage()._cdata``: meta tensors all have data_ptr 0) and parameter storages are dropped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the checkout, after the user's own packages
from checks import usercode
from checks.units import GIB

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SMALL_TENSOR = 4096  # bitsandbytes keeps 32-bit Adam state below min_8bit_size (docs/sources.md#eight-bit-adam)


class Usage(Exception):
    """The model or its input cannot be used: exit 2 in the parent, with this line."""


class Unavailable(Exception):
    """transformers is missing or cannot build the config: the parent falls back to the formulas."""


def load(ref: str, user_path: str, flag: str) -> Any:
    """Import ``MODULE:CALLABLE`` from the user's directory, callable with no arguments (verify's convention)."""
    try:
        obj = usercode.load_callable(ref, user_path)
    except usercode.UserCodeError as exc:
        raise Usage(f"{flag}: {exc}") from None
    required = usercode.required_arguments(obj)
    if required:
        raise Usage(f"{flag} {ref} needs arguments ({', '.join(required)}); plan calls it with none")
    return obj


def hf_factory(config_path: str) -> Callable[[], nn.Module]:
    """transformers' causal LM for a local config.json, built with no weights read (nothing is downloaded)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except Exception as exc:  # noqa: BLE001 - missing, or an install broken against this torch
        raise Unavailable(f"transformers cannot be imported ({type(exc).__name__}: {exc})") from None
    try:
        config = AutoConfig.from_pretrained(config_path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - an unknown model_type, a config of a newer transformers
        raise Unavailable(f"transformers cannot read it ({type(exc).__name__}: {_first_line(exc)})") from None

    def factory() -> nn.Module:
        return AutoModelForCausalLM.from_config(config)

    return factory


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


class Tally:
    """Bytes of distinct non-parameter storages saved for backward."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.params and key not in self.seen:
            self.seen[key] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


class FlashAttention(torch.autograd.Function):
    """SDPA as a fused kernel saves it: q, k, v, the output and the row logsumexp in fp32 (docs/sources.md#activation-memory). With
    dropout the kernels keep a Philox seed and offset, not a mask: nothing more is saved."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool) -> torch.Tensor:
        with torch.no_grad():
            out = _ORIGINAL_SDPA(q, k, v, is_causal=causal, enable_gqa=gqa)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # never run: plan only measures the forward
        raise NotImplementedError


_ORIGINAL_SDPA = F.scaled_dot_product_attention


def _flash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, *args: Any, **kw: Any) -> Any:
    if attn_mask is not None:  # the flash kernel takes no mask (memory-efficient attention's saves differ)
        return _ORIGINAL_SDPA(q, k, v, attn_mask, *args, **kw)
    causal = bool(args[1] if len(args) > 1 else kw.get("is_causal", False))
    return FlashAttention.apply(q, k, v, causal, bool(kw.get("enable_gqa", False)))


@contextlib.contextmanager
def attention_as(kind: str) -> Iterator[None]:
    if kind != "flash":
        yield
        return
    F.scaled_dot_product_attention = _flash_sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _ORIGINAL_SDPA


def blocks_of(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The repeated blocks activation checkpointing wraps: the longest ModuleList/Sequential, else the children."""
    best: tuple[str, list[nn.Module]] = ("", [])
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > len(best[1]):
            kids = [m for m in module if any(True for _ in m.parameters())]
            if len(kids) >= 2:
                best = (name, kids)
    if not best[1]:
        best = ("", [m for m in model.children() if any(True for _ in m.parameters())])
    return best


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(d_in, d_out) of the layers LoRA adapts: nn.Linear, and transformers' Conv1D (GPT-2's Linear with the
    weight stored transposed, which peft adapts too)."""
    shapes = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            shapes.append((m.in_features, m.out_features))
        elif type(m).__name__ == "Conv1D" and isinstance(getattr(m, "nf", None), int):
            weight: Any = m.weight  # (nx, nf)
            shapes.append((int(weight.shape[0]), int(weight.shape[1])))
    return shapes


def parameter_facts(model: nn.Module) -> dict[str, Any]:
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    linears = linear_shapes(model)
    name, blocks = blocks_of(model)
    return {
        "name": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "small_tensor_parameters": sum(p.numel() for p in params if p.numel() < SMALL_TENSOR),
        "linear_weight_parameters": sum(d_in * d_out for d_in, d_out in linears),
        "lora_per_rank": sum(d_in + d_out for d_in, d_out in linears),
        "linear_layers": len(linears),
        "blocks": len(blocks),
        "block_path": name or "(top-level children)",
        "largest_block_parameters": max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0),
    }


def make_input(spec: dict[str, Any], batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    shape = (batch, *spec["input_shape"])
    if spec["input_dtype"] == "long":
        return torch.zeros(shape, dtype=torch.long, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)


def saved_bytes(model: nn.Module, x: torch.Tensor, attention: str, per_block: bool, labels: bool) -> dict[str, Any]:
    """One forward: saved-for-backward bytes, the output's bytes, and (per_block) the most one block saved.

    ``labels``: a transformers causal LM is called as its training step calls it, with the tokens as labels: the
    loss inside the forward saves its fp32 log-softmax, and the returned logits stay alive through backward.
    """
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    tally = Tally(params)
    marks: list[int] = []
    spans: list[int] = []
    hooks = []
    if per_block:
        for block in blocks_of(model)[1]:
            hooks.append(block.register_forward_pre_hook(lambda *_: marks.append(tally.total)))
            hooks.append(block.register_forward_hook(lambda *_: spans.append(tally.total - marks.pop())))
    try:
        with torch.autograd.graph.saved_tensors_hooks(tally.pack, lambda t: t), attention_as(attention):
            out = model(input_ids=x, labels=x) if labels else model(x)
    finally:
        for h in hooks:
            h.remove()
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
    outs = [t for t in values if isinstance(t, torch.Tensor)]  # a transformers ModelOutput is a dict
    return {
        "saved": tally.total,
        "output": sum(t.untyped_storage().nbytes() for t in outs),
        "largest_block": max(spans, default=0),
    }


def checkpointed(model: nn.Module) -> None:
    """Wrap each block's forward in activation checkpointing (reentrant: the block's input is what it saves).

    Keyword arguments are bound first, as transformers' GradientCheckpointingLayer does: the reentrant
    checkpoint takes positional inputs only (its decoder layers get masks and rotary tables by keyword).
    """
    from torch.utils.checkpoint import checkpoint

    for block in blocks_of(model)[1]:
        inner = block.forward

        def wrapped(*args: Any, _inner: Callable[..., Any] = inner, **kw: Any) -> Any:
            return checkpoint(functools.partial(_inner, **kw), *args, use_reentrant=True)

        block.forward = wrapped


def build(factory: Callable[[], Any], device: str, flag: str = "--model") -> nn.Module:
    try:
        with torch.device(device):
            model = factory()
    except Exception as exc:  # noqa: BLE001
        if flag == "--hf-config":
            raise Unavailable(f"transformers cannot build it ({type(exc).__name__}: {_first_line(exc)})") from None
        raise Usage(f"{flag} could not build its model on {device}: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise Usage(f"{flag} returned {type(model).__name__}, not an nn.Module")
    return model


def measure(spec: dict[str, Any], factory: Callable[[], Any], device: str) -> dict[str, Any]:
    dtype = DTYPES[spec["dtype"]]
    model = build(factory, device, spec["flag"]).to(dtype)
    labels = spec["flag"] == "--hf-config"
    model.train()
    rows = [
        saved_bytes(model, make_input(spec, b, torch.device(device), dtype), spec["attention"], True, labels)
        for b in spec["batches"]
    ]
    out: dict[str, Any] = {"rows": rows}
    if spec["checkpointing"]:
        checkpointed(model)
        out["checkpointed"] = [
            saved_bytes(model, make_input(spec, b, torch.device(device), dtype), spec["attention"], False, labels)
            for b in spec["batches"]
        ]
    return out


def input_from_dataset(spec: dict[str, Any]) -> None:
    dataset = load(spec["dataset"], spec["user_path"], "--dataset")()
    try:
        x = torch.as_tensor(dataset[0][0])
    except Exception as exc:  # noqa: BLE001
        raise Usage(f"--dataset {spec['dataset']}: its first item has no (input, target): {exc}") from None
    spec["input_shape"] = list(x.shape)
    spec["input_dtype"] = "long" if not x.is_floating_point() else "float"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("hf_config"):
        spec |= {"flag": "--hf-config", "input_dtype": "long"}
        factory = hf_factory(spec["hf_config"])
    else:
        spec["flag"] = "--model"
        factory = load(spec["model"], spec["user_path"], "--model")
    if spec.get("dataset"):
        input_from_dataset(spec)
    meta_model = build(factory, "meta", spec["flag"])
    facts = parameter_facts(meta_model)
    result: dict[str, Any] = {"model": facts, "device": "meta", "torch": torch.__version__, "dtype": spec["dtype"]}
    if spec["flag"] == "--hf-config":
        import transformers

        result["transformers"] = transformers.__version__
    try:
        result |= measure(spec, factory, "meta")
        return result
    except Usage:
        raise
    except Exception as exc:  # noqa: BLE001 - data-dependent ops, .item(), extensions without meta kernels
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    need = facts["parameters"] * torch.empty((), dtype=DTYPES[spec["dtype"]]).element_size() * 3
    if spec.get("ram_bytes") and need > spec["ram_bytes"]:
        raise Usage(
            f"the model does not run on the meta device ({why}) and a CPU measurement needs ~{need / GIB:.1f} GiB "
            f"of RAM, {spec['ram_bytes'] / GIB:.1f} GiB available: give --params/--layers/... or --hf-config instead"
        )
    result |= measure(spec | {"batches": [1, 2]}, factory, "cpu")
    result |= {"device": "cpu", "fallback": f"the model does not run on the meta device ({why}): measured on the CPU"}
    result["batches"] = [1, 2]
    return result


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    try:
        out = run(spec)
        out.setdefault("batches", spec["batches"])
    except Usage as exc:
        out = {"usage": str(exc)}
    except Unavailable as exc:
        out = {"unavailable": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the parent reports it as one line
        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
