"""A user's small GPT-style language model on random tokens made on the GPU: no loader to wait on, so its step
is the model's forward, backward and AdamW update (bf16 autocast on CUDA).

    python tests/gpu/scripts/token_lm.py [--layers L] [--width D] [--seq T] [--batch B] [--steps N]

The GPU acceptance run judges it with ``invoke verify -- python ...`` (expected: compute-bound).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class LM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(
            width, width // 64, 4 * width, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        mask = self.mask.to(tokens.device)[: tokens.shape[1], : tokens.shape[1]]
        return self.head(self.blocks(h, mask=mask, is_causal=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=100000)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = LM(args.vocab, args.width, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, fused=device == "cuda")
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = net(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
