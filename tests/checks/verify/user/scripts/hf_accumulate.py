"""A transformers model (tiny config, built locally) fed dict batches, with gradient accumulation."""

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification

ACCUM = 2


class Texts(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {
            "input_ids": torch.randint(0, 500, (32,), generator=g),
            "attention_mask": torch.ones(32, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }


def main():
    config = BertConfig(
        vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = BertForSequenceClassification(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Texts(), batch_size=4, shuffle=True)
    for i, batch in enumerate(loader):
        loss = model(**batch).loss / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    main()
