"""A causal LM trained by the transformers Trainer on the CPU (a tiny GPT-2 built from its config, no download); a
second argument N saves a checkpoint every N steps (``save_steps``)."""

import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int = 4096, seq: int = 64, vocab: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(out: str, save_steps: int) -> None:
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=2,
        max_steps=10_000,
        learning_rate=3e-4,
        use_cpu=True,
        report_to=[],
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens()).train()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
