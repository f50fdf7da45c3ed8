"""Small real models for ``invoke plan``'s tests and benchmark: a GPT, a ResNet-50-like CNN and a ViT, plus
callables with the faults plan must report. Imported by plan's child as ``plan_models:NAME`` (tests put this
folder on the user path); sizes come from environment-free module constants so each callable takes no arguments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# GPT: the block of docs/sources.md#activation-memory (pre-LN, GeLU MLP 4h, dropout on).
GPT_LAYERS, GPT_HIDDEN, GPT_HEADS, GPT_SEQ, GPT_VOCAB = 2, 256, 4, 128, 1000


class Block(nn.Module):
    def __init__(self, h: int, a: int, attention: str = "eager", dropout: float = 0.1) -> None:
        super().__init__()
        self.a, self.attention = a, attention
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.a, h // self.a).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = (q @ k.transpose(-2, -1)) / (h // self.a) ** 0.5
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            y = self.drop(w.masked_fill(~mask, float("-inf")).softmax(-1)) @ v
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, layers: int, h: int, a: int, vocab: int, seq: int, attention: str = "eager") -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, a, attention) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos.weight[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt() -> GPT:
    return GPT(GPT_LAYERS, GPT_HIDDEN, GPT_HEADS, GPT_VOCAB, GPT_SEQ)


def gpt_sdpa() -> GPT:
    return GPT(GPT_LAYERS, GPT_HIDDEN, GPT_HEADS, GPT_VOCAB, GPT_SEQ, attention="sdpa")


def gpt_block() -> Block:
    """One block alone (input [b, s, h] floats): the unit of Korthikanti et al.'s formula."""
    return Block(GPT_HIDDEN, GPT_HEADS)


def gpt_block_sdpa() -> Block:
    """The same block calling scaled_dot_product_attention (plan measures it as a fused kernel saves)."""
    return Block(GPT_HIDDEN, GPT_HEADS, "sdpa")


# ResNet-50-like: bottleneck stages [3, 4, 6, 3], widths 64..512 x 4, as torchvision's resnet50.
class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.c1, self.b1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.c2, self.b2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.c3, self.b3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet(nn.Module):
    def __init__(self, stages: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        layers: list[nn.Module] = []
        cin = 64
        for i, n in enumerate(stages):
            width = 64 * 2**i
            for j in range(n):
                layers.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def resnet50() -> ResNet:
    return ResNet()


class TinyCNN(nn.Module):
    """conv(3->8, 3x3) -> ReLU -> flatten -> linear: small enough to count its saved tensors by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.conv(x)).flatten(1))


def tiny_cnn() -> TinyCNN:
    return TinyCNN()


class ViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 8, h: int = 192, layers: int = 4, a: int = 3) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, h, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, h))
        self.blocks = nn.ModuleList(Block(h, a, "sdpa", 0.0) for _ in range(layers))
        self.head = nn.Linear(h, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


def vit() -> ViT:
    return ViT()


class DataDependent(nn.Module):
    """A forward that reads a tensor's value: impossible on the meta device, fine on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 1e9:
            x = x / 2
        return self.fc(x)


def data_dependent() -> DataDependent:
    return DataDependent()


def broken() -> nn.Module:
    raise RuntimeError("weights file missing")


def needs_size(size: int) -> nn.Module:
    return nn.Linear(size, size)


def token_dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(GPT_SEQ, dtype=torch.long), torch.zeros(GPT_SEQ, dtype=torch.long))]
