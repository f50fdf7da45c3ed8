"""A plain PyTorch training script: copy it, or run it under ``invoke verify -- python templates/train.py``.

It trains the way a real run does, so that what verify measures on it is what a real run would meet:

- data: synthetic images or tokens (no download, learnable in a few dozen steps), a folder written by
  ``invoke stage-data`` (``--data FOLDER``: images.npy or tokens.npy, read through ``staged_dataset.py`` beside
  this file), or your own map-style dataset (``--dataset MODULE:CALLABLE``, items ``(input, target)``);
- a model: a compact residual CNN for images, a small causal transformer for tokens, or your own
  (``--model MODULE:CALLABLE``; the loss is ``model.loss(output, target)`` when the module has one, else cross
  entropy over the last dimension);
- a ``DataLoader`` with ``--workers`` processes, pinned memory on a GPU, and a sampler that can start mid-epoch;
- mixed precision (bf16 autocast from sm_80, fp16 with a GradScaler on older cards, fp32 on the CPU), gradient
  accumulation (``--accum``), DDP when started by ``torchrun`` (NCCL on GPUs, gloo on the CPU);
- checkpoints every ``--ckpt-every`` steps into ``--ckpt-dir`` (``--ckpt-name``, ``last.pt``) holding everything a
  resume needs (model, optimizer, scaler, step, epoch, position in the epoch, loss, every RNG), written to a
  temporary name, flushed to disk and renamed (the rename made durable too), so neither an interrupted save nor a
  machine that goes down leaves a torn file; ``--resume FILE`` continues where it left off.

numpy and torch only. Under verify the agent times every part of the step; the one part no hook can tell from the
forward pass, the host-to-device copy, is marked with ``region("h2d")``, and each step asks ``should_stop()``, so
that verify ends it as its last step would (its final save, its last line) instead of interrupting it; both do
nothing outside verify.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler

HERE = Path(__file__).resolve().parent
SIZES = {  # "small" steps in a few hundred ms on two CPU cores; "base" gives a GPU's kernels enough work
    "small": {"width": 32, "d_model": 128, "layers": 2, "heads": 4},
    "base": {"width": 64, "d_model": 512, "layers": 6, "heads": 8},
}
SYNTHETIC_SAMPLES = 1_000_000  # generated on demand: a run never wraps an epoch
# verify's marker for the host-to-device copy (a no-op outside verify)
mark = getattr(sys.modules.get("_gpu_preflight_agent"), "region", None) or (lambda name: contextlib.nullcontext())
# verify's request to stop once it has what it needs (always False outside verify): the loop ends as at its last step
should_stop = getattr(sys.modules.get("_gpu_preflight_agent"), "should_stop", None) or (lambda: False)


class UsageError(Exception):
    """Flags this script cannot run with: one line on stderr and exit 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="synthetic-images", help="synthetic-images, synthetic-tokens or a staged folder")
    p.add_argument("--dataset", default="", help="MODULE:CALLABLE returning a map-style dataset of (input, target)")
    p.add_argument("--model", default="", help="MODULE:CALLABLE returning an nn.Module")
    p.add_argument("--size", default="auto", choices=("auto", "small", "base"), help="the built-in model's size")
    p.add_argument("--image-size", type=int, default=64, help="synthetic images' side in pixels")
    p.add_argument("--classes", type=int, default=100, help="synthetic images' classes")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sample (synthetic or staged tokens)")
    p.add_argument("--batch-size", type=int, default=0, help="per process; 0: 32 on the CPU, 128 on a GPU")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--workers", type=int, default=-1, help="DataLoader workers; -1: half the cores, at most 8")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: --epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16", "fp32"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--ckpt-dir", default="", help="where checkpoints go ('': none)")
    p.add_argument("--ckpt-name", default="last.pt", help="the checkpoint's file name in --ckpt-dir")
    p.add_argument("--ckpt-every", type=int, default=0, help="a checkpoint every N steps (0: at the end only)")
    p.add_argument("--resume", default="", help="a checkpoint this script wrote: continue from it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    # verify's resume replay (BatchReplay): not for a real run
    p.add_argument("--keep-batches", default="", help="keep the batches of the steps after the first save here")
    p.add_argument("--keep-steps", type=int, default=2, help="how many steps' batches --keep-batches keeps")
    p.add_argument("--replay-batches", default="", help="with --resume: train on the batches kept here")
    args = p.parse_args(argv)
    for name in ("accum", "epochs", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.ckpt_name or os.sep in args.ckpt_name or args.ckpt_name in (".", ".."):
        p.error(f"--ckpt-name must be a file name, got {args.ckpt_name!r}")
    for name in ("batch_size", "steps", "ckpt_every"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}")
    return args


# --- data ------------------------------------------------------------------------------------------------------


class SyntheticImages:
    """(uint8 S x S x 3, label) pairs: a class's 8 x 8 pattern scaled up, plus noise drawn from a seeded pool at an
    offset hashed from the index. The same index always gives the same bytes; a batch is one gather."""

    def __init__(self, size: int, classes: int, seed: int) -> None:
        self.classes = classes
        cells = np.random.default_rng([seed, 7]).integers(0, 256, (classes, 8, 8, 3), dtype=np.uint8)
        scale = -(-size // 8)
        self.patterns = cells.repeat(scale, axis=1).repeat(scale, axis=2)[:, :size, :size] // 2
        self.pool = np.random.default_rng([seed, 13]).integers(0, 128, (1 << 20) + self.patterns[0].size, np.uint8)

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, int]]:
        labels = [int(i) % self.classes for i in indices]
        offsets = (np.asarray(indices, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(44)
        windows = np.lib.stride_tricks.sliding_window_view(self.pool, self.patterns[0].size)
        images = windows[offsets.astype(np.intp)].reshape(len(indices), *self.patterns.shape[1:])
        images += self.patterns[labels]  # at most 127 + 127: never wraps
        return list(zip(images, labels, strict=True))


class SyntheticTokens:
    """Windows of a sparse Markov chain over 256 tokens (4 likely successors each): the loss falls from ln 256
    towards ln 4 as the model learns the chain."""

    vocab = 256

    def __init__(self, seq_len: int, seed: int) -> None:
        self.seq_len, self.seed = seq_len, seed
        self.successors = np.random.default_rng([seed, 11]).integers(0, self.vocab, (self.vocab, 4))

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, int(i)])
        picks, token = rng.integers(0, 4, self.seq_len + 1), int(rng.integers(0, self.vocab))
        row = np.empty(self.seq_len + 1, dtype=np.int64)
        for t in range(self.seq_len + 1):
            row[t] = token
            token = int(self.successors[token, picks[t]])
        return row[:-1], row[1:]


class StagedTokens:
    """Windows of ``seq_len`` tokens from stage-data's tokens.npy (memory-mapped in each worker on first use)."""

    def __init__(self, root: Path, seq_len: int) -> None:
        self.root, self.seq_len = root, seq_len
        manifest = json.loads((root / "manifest.json").read_text())
        tokens = np.load(root / "tokens.npy", mmap_mode="r")
        self.windows = (len(tokens) - 1) // seq_len
        self.vocab = int(manifest.get("vocab_size") or manifest.get("vocab") or int(tokens.max()) + 1)
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._tokens is None:
            self._tokens = np.load(self.root / "tokens.npy", mmap_mode="r")
        start = int(i) * self.seq_len
        window = np.asarray(self._tokens[start : start + self.seq_len + 1], dtype=np.int64)
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:  # a worker gets the path, not the map
        return {**self.__dict__, "_tokens": None}


def load_callable(ref: str) -> Any:
    """``MODULE:CALLABLE`` (``CALLABLE`` may be dotted) imported from the current folder, called with no
    arguments; any error on the way is a usage error (exit 2) naming it."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise UsageError(f"{ref!r} is not MODULE:CALLABLE (e.g. mydata:make_dataset)")
    sys.path.insert(0, os.getcwd())
    try:
        factory = importlib.import_module(module)
        for part in name.split("."):  # mymodel:Factory.build works
            factory = getattr(factory, part)
    except Exception as exc:  # noqa: BLE001 - a missing module or attribute, or an error at import: exit 2
        raise UsageError(f"cannot import {ref}: {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise UsageError(f"{ref} is a {type(factory).__name__}, not a callable")
    try:
        return factory()
    except TypeError as exc:
        raise UsageError(f"{ref}() failed: {exc} (give a function that takes no arguments)") from None


def build_data(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The dataset and what the model needs to know of it (kind, classes or vocabulary, sequence length)."""
    if args.dataset:
        dataset = load_callable(args.dataset)
        x = np.asarray(dataset[0][0]) if not args.model else None
        if x is None:
            return dataset, {"kind": "user"}
        if x.ndim == 3 and x.shape[2] == 3 and x.dtype == np.uint8:
            classes = getattr(dataset, "num_classes", None) or len(getattr(dataset, "classes", ())) or 1000
            return dataset, {"kind": "images", "classes": int(classes)}
        if x.ndim == 1 and x.dtype.kind in "iu":
            vocab = int(getattr(dataset, "vocab_size", 65536))
            return dataset, {"kind": "tokens", "vocab": vocab, "seq_len": len(x)}
        raise UsageError(f"{args.dataset} items are neither uint8 H x W x 3 images nor token windows: pass --model")
    if args.data == "synthetic-images":
        return SyntheticImages(args.image_size, args.classes, args.seed), {"kind": "images", "classes": args.classes}
    if args.data == "synthetic-tokens":
        data = SyntheticTokens(args.seq_len, args.seed)
        return data, {"kind": "tokens", "vocab": data.vocab, "seq_len": args.seq_len}
    root = Path(args.data)
    if (root / "images.npy").exists():
        sys.path.insert(0, str(HERE))
        from staged_dataset import StagedImages

        images = StagedImages(root)
        return images, {"kind": "images", "classes": len(images.classes)}
    if (root / "tokens.npy").exists():
        tokens = StagedTokens(root, args.seq_len)
        return tokens, {"kind": "tokens", "vocab": tokens.vocab, "seq_len": args.seq_len}
    raise UsageError(f"--data {args.data}: neither images.npy nor tokens.npy there (stage it with invoke stage-data)")


class ResumableSampler(Sampler[int]):
    """This process's share of a permutation drawn from (seed, epoch), from batch ``start`` on: a run resumed
    from a checkpoint sees exactly the samples the uninterrupted run would have."""

    def __init__(self, samples: int, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.per_rank = samples // world // batch_size * batch_size  # full batches only, the same on every rank
        if self.per_rank == 0:
            raise UsageError(f"the dataset holds {samples} samples: fewer than one batch of {batch_size} per process")
        self.samples, self.batch_size, self.seed, self.rank, self.world = samples, batch_size, seed, rank, world
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start = epoch, start_batch

    def __len__(self) -> int:
        return self.per_rank - self.start * self.batch_size

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.samples, generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        self.mine = order[self.rank :: self.world][: self.per_rank]
        return iter(self.mine[self.start * self.batch_size :].tolist())

    def batch_indices(self, position: int) -> list[int]:
        """The samples of the epoch's batch ``position`` (this epoch's, once iteration began)."""
        return self.mine[position * self.batch_size : (position + 1) * self.batch_size].tolist()


class BatchReplay:
    """verify's resume replay (nothing without its flags). The first run keeps the batches of the steps after its
    first save, with their samples' indices; the run resumed from that save trains on those batches, so that its
    losses judge the checkpoint alone, whatever the loader draws, and writes whether its own loader drew the same
    (random augmentation in DataLoader workers cannot resume exactly: no checkpoint holds the workers' RNGs)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.keep = Path(args.keep_batches, f"batches-{rank}.npz") if args.keep_batches else None
        self.wanted, self.kept, self.linked = args.keep_steps * args.accum, [], False
        self.replay, self.same = [], []
        self.out = Path(args.replay_batches, f"same-{rank}.json") if args.replay_batches else None
        if self.out is not None:
            with np.load(self.out.with_name(f"batches-{rank}.npz")) as f:
                self.replay = [(f[f"i{n}"], f[f"x{n}"], f[f"y{n}"]) for n in range(len(f.files) // 3)]

    def batch(self, inputs: torch.Tensor, target: torch.Tensor, indices: list[int], saved: bool) -> tuple[Any, Any]:
        """The batch to train on: the kept one while there is one to replay, else the loader's."""
        if self.keep is not None and saved:
            try:
                self.kept.append((np.asarray(indices), inputs.numpy().copy(), target.numpy().copy()))
            except TypeError:  # a dtype numpy cannot hold (bf16): nothing kept, the replay draws its own
                self.keep = None
            if len(self.kept) == self.wanted:
                self.write()
        if len(self.same) == len(self.replay):
            return inputs, target
        i, x, y = self.replay[len(self.same)]
        same = {"indices": np.array_equal(i, indices), "inputs": np.array_equal(x, inputs.numpy())}
        self.same.append({k: bool(v) for k, v in {**same, "targets": np.array_equal(y, target.numpy())}.items()})
        self.out.write_text(json.dumps(self.same))  # after each batch: the replay may stop at any step
        return torch.from_numpy(x), torch.from_numpy(y)

    def saved(self, path: Path) -> None:
        """The first save linked beside the batches that follow it (the script overwrites its own file; a link is
        free, a copy across filesystems is not: then verify keeps the file itself)."""
        if self.keep is not None and not self.linked:
            self.linked = True
            with contextlib.suppress(OSError):
                os.link(path, self.keep.with_name("first.pt"))

    def write(self) -> None:
        """The kept batches to their file, once (np.savez: not a torch.save verify would take for a checkpoint)."""
        if self.keep is not None and self.kept:
            self.keep.parent.mkdir(parents=True, exist_ok=True)
            np.savez(
                self.keep,
                **{f"{k}{n}": a for n, kept in enumerate(self.kept) for k, a in zip("ixy", kept, strict=True)},
            )
        self.keep = None


# --- models -----------------------------------------------------------------------------------------------------


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(channels, channels, 1), _conv(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class CompactCNN(nn.Module):
    """Takes uint8 NHWC images as they come off the loader and normalises them on the device (the copy moves
    bytes, not floats); NHWC permuted to NCHW is already the channels-last layout tensor cores want."""

    def __init__(self, classes: int, width: int) -> None:
        super().__init__()
        mean, std = torch.tensor([0.485, 0.456, 0.406]) * 255, torch.tensor([0.229, 0.224, 0.225]) * 255
        self.register_buffer("mean", mean.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", std.view(1, 3, 1, 1), persistent=False)
        w, stages = width, [_conv(3, width, 1)]
        for cin, cout in ((w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w)):
            stages += [_conv(cin, cout, 2), Residual(cout)]
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(8 * w, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.permute(0, 3, 1, 2).float() - self.mean) / self.std
        return self.head(self.features(x).mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings (std 0.02, so the first loss is near ln(vocab)), pre-norm causal blocks, the
    output projection tied to the token embedding."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.T


def build_model(args: argparse.Namespace, info: dict[str, Any], device: torch.device) -> nn.Module:
    if args.model:
        return load_callable(args.model)
    if info["kind"] == "user":
        raise UsageError(f"--dataset {args.dataset} needs --model (its items are not images or token windows)")
    s = SIZES[args.size if args.size != "auto" else ("base" if device.type == "cuda" else "small")]
    if info["kind"] == "images":
        return CompactCNN(info["classes"], s["width"])
    return TinyGPT(info["vocab"], info["seq_len"], s["d_model"], s["layers"], s["heads"])


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Over the last dimension: logits [B, C] with labels [B], or [B, T, V] with [B, T]."""
    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten().long())


# --- the run ----------------------------------------------------------------------------------------------------


def pick_device(wanted: str, local_rank: int) -> torch.device:
    if wanted == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but this torch cannot use CUDA here (run invoke bootstrap)")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def pick_precision(wanted: str, device: torch.device) -> tuple[str, torch.dtype | None]:
    if wanted == "auto":
        major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0
        wanted = "bf16" if major >= 8 else "fp16" if major >= 7 else "fp32"
    if wanted == "fp16" and device.type != "cuda":
        raise UsageError("--precision fp16 needs a GPU; use bf16 or fp32 on the CPU")
    return wanted, {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[wanted]


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary name, flush it to disk, rename, and flush the rename: a save cut short never replaces
    the last good checkpoint, nor does a machine that goes down before the kernel wrote the file (a rename can
    reach the disk before the data it names). Under verify the whole of it is the save's time: on a network mount
    the flushes can cost more than the write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with mark("checkpoint"):
        torch.save(state, partial)
        _fsync(partial)
        os.replace(partial, path)
        _fsync(path.parent, folder=True)


def _fsync(path: Path, folder: bool = False) -> None:
    """Flush a file, or a folder's entries, to disk (a filesystem that refuses a folder's fsync changes nothing:
    the rename happened; a file's failure is a save that failed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not folder:
            raise
    finally:
        os.close(fd)


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    if world > 1:  # started by torchrun: its environment names the rendezvous
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    dataset, info = build_data(args)
    model = build_model(args, info, device).to(device)
    loss_fn = getattr(model, "loss", None) if callable(getattr(model, "loss", None)) else cross_entropy
    precision, dtype = pick_precision(args.precision, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.index is not None else None
        )

    batch = args.batch_size or (128 if device.type == "cuda" else 32)
    workers = args.workers if args.workers >= 0 else min(8, (os.cpu_count() or 2) // 2)
    sampler = ResumableSampler(len(dataset), batch, args.seed, rank, world)
    loader = DataLoader(
        dataset, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True,
        pin_memory=device.type == "cuda", persistent_workers=workers > 0,
    )  # fmt: skip
    steps_per_epoch = len(sampler) // batch // args.accum
    total = args.steps or steps_per_epoch * args.epochs
    step, epoch, position, loss_value = 0, 0, 0, math.nan
    replay = BatchReplay(args, rank)

    if args.resume:
        saved = torch.load(args.resume, map_location=device, weights_only=True)
        (model.module if world > 1 else model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if scaler is not None and saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        step, epoch, position, loss_value = saved["step"], saved["epoch"], saved["position"], saved["loss"]
        set_rng_state(saved["rng"], device)
        print(f"resumed from {args.resume} at step {step} (epoch {epoch}, batch {position})", flush=True)

    def checkpoint() -> None:
        if args.ckpt_dir and rank == 0:
            state = {
                "model": (model.module if world > 1 else model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "step": step, "epoch": epoch, "position": position, "loss": loss_value,
                "seed": args.seed, "rng": rng_state(device),
            }  # fmt: skip
            save_checkpoint(Path(args.ckpt_dir) / args.ckpt_name, state)
            replay.saved(Path(args.ckpt_dir) / args.ckpt_name)

    model.train()
    started, logged = time.monotonic(), step
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else contextlib.nullcontext
    stopping = False
    try:
        while step < total and not stopping:
            sampler.set_epoch(epoch, position)
            micro, running = 0, torch.zeros((), device=device)
            for inputs, target in loader:
                if args.keep_batches or args.replay_batches:  # under verify only
                    indices = sampler.batch_indices(position)
                    inputs, target = replay.batch(inputs, target, indices, 0 < args.ckpt_every <= step)
                with mark("h2d"):
                    inputs = inputs.to(device, non_blocking=True)
                    target = target.to(device, non_blocking=True)
                with autocast():
                    loss = loss_fn(model(inputs), target)
                scaled = loss / args.accum
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
                running += loss.detach()
                position, micro = position + 1, micro + 1
                if micro < args.accum:
                    continue
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step, micro = step + 1, 0
                loss_value, running = float(running) / args.accum, torch.zeros((), device=device)
                if step % args.log_every == 0 and rank == 0:
                    rate = (step - logged) * batch * args.accum * world / (time.monotonic() - started)
                    print(f"step {step}/{total} loss {loss_value:.4f} {rate:.1f} samples/s", flush=True)
                    started, logged = time.monotonic(), step
                if args.ckpt_every and step % args.ckpt_every == 0:
                    checkpoint()
                stopping = should_stop()  # every rank turns True at the same step
                if step >= total or stopping:
                    break
            else:
                epoch, position = epoch + 1, 0
        replay.write()  # the batches kept so far, if the run ended before --keep-steps
        checkpoint()
    except KeyboardInterrupt:  # Ctrl-C (or verify's stop) after a step: say where it stood, no traceback
        print(f"interrupted at step {step}", flush=True)
        return 130
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"trained {step} steps, last loss {loss_value:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        sys.exit(2)
