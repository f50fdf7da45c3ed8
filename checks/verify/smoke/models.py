"""The built-in models: a compact residual CNN for images and a small causal transformer for tokens.

Two sizes: ``small`` for the CPU (a step in a few hundred ms on two cores) and ``base`` for a GPU (enough work per
kernel that a healthy GPU is the bottleneck). Both take the batches of ``checks.verify.smoke.data`` as they arrive on
the device: the CNN turns uint8 NHWC into normalised float itself; NHWC permuted to NCHW is already the
channels-last layout that tensor-core convolutions want.
"""

from __future__ import annotations

import typing
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    "small": {"width": 32, "d_model": 128, "layers": 2, "heads": 4},
    "base": {"width": 64, "d_model": 512, "layers": 6, "heads": 8},
}
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics, as torchvision uses


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(channels, channels, 1), _conv(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class CompactCNN(nn.Module):
    """Stem, three down-sampling stages with a residual block each, global pooling, a linear classifier."""

    def __init__(self, classes: int, width: int) -> None:
        super().__init__()
        w = width
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255, persistent=False)
        stages: list[nn.Module] = [_conv(3, w, 1)]
        for cin, cout in ((w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w)):
            stages += [_conv(cin, cout, 2), _Residual(cout)]
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(8 * w, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = typing.cast(torch.Tensor, self.mean), typing.cast(torch.Tensor, self.std)
        x = (images.permute(0, 3, 1, 2).float() - mean) / std
        return self.head(self.features(x).mean(dim=(2, 3)))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, pre-norm causal blocks, a tied output projection.

    Embeddings start at std 0.02 (GPT-2's init): the tied projection then gives logits of std ~0.02·sqrt(d_model),
    so the first loss is near ln(vocab), as a fresh language model's should be. nn.Embedding's default N(0, 1)
    gives logits of std ~sqrt(d_model) and a first loss of ~54 for 256 tokens.
    """

    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()  # int32/int16/uint16 windows index the embedding as int64
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.T


def build_model(data: dict[str, Any], size: str) -> nn.Module:
    """Return the built-in model for a ``DataSpec`` (as a dict) in the given size."""
    s = SIZES[size]
    if data["kind"] == "images":
        return CompactCNN(data["classes"], s["width"])
    return TinyGPT(data["vocab"], data["seq_len"], s["d_model"], s["layers"], s["heads"])


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy over the last dimension: logits [B, C] with labels [B], or [B, T, V] with [B, T].

    Integer targets of any width (int32 token windows, uint16 from a staged file) become int64, which
    cross_entropy requires for class indices.
    """
    if not target.is_floating_point():
        target = target.long()
    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten())


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
