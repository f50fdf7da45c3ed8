"""Child process of ``invoke plan`` (torch): build the model on the meta device, count its parameters and measure
the bytes autograd saves for backward at two batch sizes. Run by checks/plan/measure.py.

argv[1] is the spec (JSON): ``model`` (MODULE:CALLABLE), ``user_path``, ``input_shape`` (one sample, no batch
dimension) and ``input_dtype`` ("float" or "long"), or ``dataset`` (MODULE:CALLABLE: the first item's input
gives both), ``dtype`` (the compute dtype: bfloat16, float16, float32), ``batches`` (two sizes),
``checkpointing``, ``attention`` ("flash": scaled_dot_product_attention saves q, k, v, the output and a b·a·s
fp32 logsumexp, as the GPU kernels do; "as-written": whatever the meta math path saves), ``ram_bytes``.
Prints one JSON object on its last line: ``{"usage": ...}`` for a model that cannot be loaded or built.

Measuring on meta (ref/communication-and-planning.md §6.4): ``saved_tensors_hooks`` sees every saved tensor;
views share storage and Linear saves its weight, so bytes are summed once per storage
(``untyped_storage()._cdata``: meta tensors all have data_ptr 0) and parameter storages are dropped.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SMALL_TENSOR = 4096  # bitsandbytes keeps 32-bit Adam state below min_8bit_size (ref §6.1 "8-bit Adam")


class Usage(Exception):
    """The model or its input cannot be used: exit 2 in the parent, with this line."""


def load(ref: str, user_path: str, flag: str) -> Any:
    """Import ``MODULE:CALLABLE`` from the user's directory and call it with no arguments (verify's convention)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise Usage(f"{flag} {ref!r} is not MODULE:CALLABLE")
    sys.path.insert(0, user_path)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - any import-time failure of user code is the user's to see
        raise Usage(f"cannot load {flag} {ref}: {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise Usage(f"{flag} {ref} is not callable")
    try:
        required = [
            p.name
            for p in inspect.signature(obj).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        required = []
    if required:
        raise Usage(f"{flag} {ref} needs arguments ({', '.join(required)}); plan calls it with none")
    return obj


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
    """SDPA as a fused kernel saves it: q, k, v, the output and the row logsumexp in fp32 (ref §6.3)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        with torch.no_grad():
            out = _ORIGINAL_SDPA(q, k, v, is_causal=causal)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # never run: plan only measures the forward
        raise NotImplementedError


_ORIGINAL_SDPA = F.scaled_dot_product_attention


def _flash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, *args: Any, **kw: Any) -> Any:
    if attn_mask is not None or kw.get("dropout_p", 0.0) or (args and args[0]):
        return _ORIGINAL_SDPA(q, k, v, attn_mask, *args, **kw)
    return FlashAttention.apply(q, k, v, bool(kw.get("is_causal", False)))


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


def parameter_facts(model: nn.Module) -> dict[str, Any]:
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    name, blocks = blocks_of(model)
    return {
        "name": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "small_tensor_parameters": sum(p.numel() for p in params if p.numel() < SMALL_TENSOR),
        "linear_weight_parameters": sum(m.weight.numel() for m in linears),
        "lora_per_rank": sum(m.in_features + m.out_features for m in linears),
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


def saved_bytes(model: nn.Module, x: torch.Tensor, attention: str, per_block: bool) -> dict[str, Any]:
    """One forward: saved-for-backward bytes, the output's bytes, and (per_block) the most one block saved."""
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
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
    return {
        "saved": tally.total,
        "output": sum(t.untyped_storage().nbytes() for t in outs),
        "largest_block": max(spans, default=0),
    }


def checkpointed(model: nn.Module) -> None:
    """Wrap each block's forward in activation checkpointing (reentrant: the block's input is what it saves)."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks_of(model)[1]:
        inner = block.forward

        def wrapped(*args: Any, _inner: Callable[..., Any] = inner, **kw: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=True, **kw)

        block.forward = wrapped


def build(factory: Callable[[], Any], device: str) -> nn.Module:
    try:
        with torch.device(device):
            model = factory()
    except Exception as exc:  # noqa: BLE001
        raise Usage(f"--model could not build its model on {device}: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise Usage(f"--model returned {type(model).__name__}, not an nn.Module")
    return model


def measure(spec: dict[str, Any], factory: Callable[[], Any], device: str) -> dict[str, Any]:
    dtype = DTYPES[spec["dtype"]]
    model = build(factory, device).to(dtype)
    model.train()
    rows = [
        saved_bytes(model, make_input(spec, b, torch.device(device), dtype), spec["attention"], True)
        for b in spec["batches"]
    ]
    out: dict[str, Any] = {"rows": rows}
    if spec["checkpointing"]:
        checkpointed(model)
        out["checkpointed"] = [
            saved_bytes(model, make_input(spec, b, torch.device(device), dtype), spec["attention"], False)
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
    factory = load(spec["model"], spec["user_path"], "--model")
    if spec.get("dataset"):
        input_from_dataset(spec)
    meta_model = build(factory, "meta")
    facts = parameter_facts(meta_model)
    result: dict[str, Any] = {"model": facts, "device": "meta", "torch": torch.__version__, "dtype": spec["dtype"]}
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
            f"the model does not run on the meta device ({why}) and a CPU measurement needs ~{need / 2**30:.1f} GiB "
            f"of RAM, {spec['ram_bytes'] / 2**30:.1f} GiB available: give --params/--layers/... or --hf-config instead"
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
    except Exception as exc:  # noqa: BLE001 - the parent reports it as one line
        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
