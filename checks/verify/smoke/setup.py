"""Build a smoke run from its spec (child process, torch): device, precision, data, model, optimizer, loader.

``--dataset MODULE:CALLABLE`` / ``--model MODULE:CALLABLE`` convention (imports resolved from the directory
verify was started in): each callable takes no arguments (one that needs some is a usage error, exit 2). The dataset callable returns a map-style dataset
(``__len__``, ``__getitem__``) whose items are ``(input, target)``; the model callable returns an ``nn.Module``
with ``model(input) -> output``. The loss is ``model.loss(output, target)`` when the module has a callable
``loss`` attribute, else cross entropy over the last dimension (logits [B, C] with class indices [B], or
[B, T, V] with [B, T]). Given a dataset but no model, items that look like images (uint8 H x W x 3) or token
windows (1-D integers) get the built-in model, sized from the dataset's ``num_classes``/``classes`` or
``vocab_size`` attribute when present.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from checks import usercode
from checks.verify.contract import RunSpec
from checks.verify.smoke.ckpt import strip_prefixes
from checks.verify.smoke.data import DataSpec, make_dataset
from checks.verify.smoke.loop import CudaClock, Feed, HostClock, Trainer, loader_kwargs
from checks.verify.smoke.models import build_model, count_parameters, default_loss

_FALLBACK_CLASSES, _FALLBACK_VOCAB = 1000, 65536  # an oversized output layer is harmless for cross entropy


class UsageError(Exception):
    """A spec the child cannot run (a bad --model/--dataset, CUDA asked for but absent): exit 2 in the parent."""


@dataclass
class Build:
    """Everything the phases need, plus factories for fresh feeds and a fresh resumed trainer."""

    spec: RunSpec
    device: torch.device
    dataset: Any
    data: dict[str, Any]
    make_model: Callable[[], torch.nn.Module]
    precision: str
    trainer: Trainer
    feed: Feed
    batch_size: int
    loader: dict[str, Any]
    shard: tuple[int, int] | None = None  # (rank, world size) under DDP
    wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m  # DDP's wrapper once the run is distributed

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def fresh_dataset(self) -> Any:
        """Another instance of the built-in dataset (the user's own is returned as it is)."""
        return self.dataset if self.spec.dataset else make_dataset(DataSpec(**self.data), self.spec.seed)

    def feed_factory(self, batch: int, epoch: int = 0, start: int = 0) -> Feed:
        return Feed(self.dataset, batch, self.spec.seed, self.loader, epoch, start, self.shard)

    def fresh_trainer(self, restored: dict[str, Any]) -> Trainer:
        """A new model and optimizer loaded from a checkpoint (``module.`` prefixes stripped)."""
        model = self.make_model().to(self.device)
        model.load_state_dict(strip_prefixes(restored["model"]))
        loss = loss_of(model)  # the new model's own: a bound ``loss`` of the old one would train the old layers
        model = self.wrap(model)
        optimizer = make_optimizer(model, self.spec.lr)
        optimizer.load_state_dict(restored["optimizer"])
        scaler = make_scaler() if self.trainer.scaler is not None else None
        if scaler is not None and restored.get("scaler"):
            scaler.load_state_dict(restored["scaler"])
        t = self.trainer
        return Trainer(model, optimizer, loss, t.device, t.clock, t.accum, t.autocast_dtype, scaler)

    def describe(self) -> dict[str, Any]:
        d = self.device
        device: dict[str, Any] = {"type": d.type, "name": "cpu", "uuid": None, "capability": None}
        if self.cuda:
            props = torch.cuda.get_device_properties(d)
            device.update(name=props.name, capability=[props.major, props.minor], total_memory=props.total_memory)
            device["uuid"] = str(getattr(props, "uuid", "")) or None
        model = self.trainer.model
        return {
            "device": device,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "precision": self.precision,
            "batch_size": self.batch_size,
            "accum": self.trainer.accum,
            "loader": self.loader,
            "model": {
                "name": type(model).__name__,
                "parameters": count_parameters(model),
                "user": bool(self.spec.model),
            },
            "data": self.data | {"reader": f"{type(self.dataset).__module__}.{type(self.dataset).__name__}"},
        }


def load_callable(ref: str, user_path: str) -> Callable[[], Any]:
    """Import ``MODULE:CALLABLE`` with ``user_path`` first on sys.path (``checks.usercode``); exit 2 when it fails."""
    try:
        return usercode.load_callable(ref, user_path)
    except usercode.UserCodeError as exc:
        raise UsageError(str(exc)) from None


def call_factory(flag: str, ref: str, factory: Callable[..., Any]) -> Any:
    """Call a --dataset/--model callable with no arguments; one that needs some is a usage error (exit 2)."""
    missing = usercode.required_arguments(factory)
    if missing:
        raise UsageError(
            f"{flag} {ref} needs arguments ({', '.join(missing)}); verify calls it with none: "
            f"give a function that takes no arguments and builds it, e.g. def make(): return {ref.partition(':')[2]}(...)"
        )
    return factory()


def pick_device(wanted: str) -> torch.device:
    if wanted == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch cannot use CUDA here (see bootstrap's torch-build and cuda-compat)")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def pick_precision(wanted: str, device: torch.device) -> tuple[str, torch.dtype | None, bool]:
    """(name, autocast dtype, needs GradScaler): bf16 from sm_80, fp16 + GradScaler on sm_7x, fp32 on the CPU."""
    if wanted == "auto":
        if device.type != "cuda":
            wanted = "fp32"
        else:
            major = torch.cuda.get_device_capability(device)[0]
            wanted = "bf16" if major >= 8 and torch.cuda.is_bf16_supported() else "fp16" if major >= 7 else "fp32"
    if wanted == "fp16" and device.type != "cuda":
        raise UsageError("fp16 autocast needs a GPU; use bf16 or fp32 on the CPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[wanted]
    return wanted, dtype, wanted == "fp16"


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr)


def make_scaler() -> Any:
    amp = getattr(torch, "amp", None)
    return amp.GradScaler("cuda") if amp is not None and hasattr(amp, "GradScaler") else torch.cuda.amp.GradScaler()


def _user_data(spec: RunSpec) -> tuple[Any, dict[str, Any]]:
    dataset = call_factory("--dataset", spec.dataset, load_callable(spec.dataset, spec.user_path))
    try:
        samples = len(dataset)
        first = dataset[0]
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{spec.dataset} did not return a map-style dataset: {type(exc).__name__}: {exc}") from None
    info: dict[str, Any] = {"kind": "user", "source": spec.dataset, "samples": samples}
    if not spec.model:
        info.update(_infer_kind(spec.dataset, dataset, first))
    elif _is_window(first):  # the user's model: still count tokens per sample for tokens/s
        info["seq_len"] = len(np.asarray(first[0]))
    return dataset, info


def _is_window(first: Any) -> bool:
    """Whether an item's input is a 1-D integer token window."""
    try:
        x = np.asarray(first[0])
    except Exception:  # noqa: BLE001 - an input numpy cannot read (a dict, a custom object) is no window
        return False
    return x.ndim == 1 and x.dtype.kind in "iu"


def _infer_kind(ref: str, dataset: Any, first: Any) -> dict[str, Any]:
    x = np.asarray(first[0])
    if x.ndim == 3 and x.shape[2] == 3 and x.dtype == np.uint8:
        classes = getattr(dataset, "num_classes", None) or len(getattr(dataset, "classes", ())) or _FALLBACK_CLASSES
        return {"kind": "images", "image_size": x.shape[0], "classes": int(classes)}
    if x.ndim == 1 and x.dtype.kind in "iu":
        return {"kind": "tokens", "seq_len": len(x), "vocab": int(getattr(dataset, "vocab_size", _FALLBACK_VOCAB))}
    raise UsageError(f"{ref} items are neither uint8 H x W x 3 images nor 1-D token windows: pass --model too")


def loss_of(model: torch.nn.Module) -> Callable[[Any, Any], Any]:
    """``model.loss(output, target)`` when the module has one (bound to this model), else cross entropy."""
    loss = getattr(model, "loss", None)
    return loss if callable(loss) else default_loss


def build(spec: RunSpec) -> Build:
    """Seed everything, then build data, model, optimizer, loader and the trainer the spec describes."""
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    device = pick_device(spec.device)
    if spec.dataset or spec.data is None:
        dataset, data = _user_data(spec)
    else:
        data = spec.data.to_json()
        dataset = make_dataset(spec.data, spec.seed)
    size = spec.model_size if spec.model_size != "auto" else ("base" if device.type == "cuda" else "small")
    user_model = load_callable(spec.model, spec.user_path) if spec.model else None

    def make_model() -> torch.nn.Module:
        return call_factory("--model", spec.model, user_model) if user_model is not None else build_model(data, size)

    model = make_model().to(device)
    model.train()
    precision, dtype, scaled = pick_precision(spec.precision, device)
    clock = CudaClock() if device.type == "cuda" else HostClock()
    optimizer = make_optimizer(model, spec.lr)
    trainer = Trainer(model, optimizer, loss_of(model), device, clock, spec.accum, dtype)
    trainer.scaler = make_scaler() if scaled else None
    batch = spec.batch_size or (spec.batch_size_gpu if device.type == "cuda" else spec.batch_size_cpu)
    loader = loader_kwargs(spec.loader, device.type == "cuda")
    shard = (spec.ddp.rank, spec.ddp.world_size) if spec.ddp else None
    feed = Feed(dataset, batch, spec.seed, loader, shard=shard)
    return Build(spec, device, dataset, data, make_model, precision, trainer, feed, batch, loader, shard)
