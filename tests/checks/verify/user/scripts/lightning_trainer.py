"""A LightningModule trained by Lightning's Trainer on the CPU (32-bit: the optimizer step runs the closure); with a
folder argument, ``ModelCheckpoint`` saves there every 2 steps, every file kept."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 4, (4096,)))
    folder = sys.argv[1] if len(sys.argv) > 1 else None
    every: list[L.pytorch.callbacks.Callback] = (
        [L.pytorch.callbacks.ModelCheckpoint(folder, every_n_train_steps=2, save_top_k=-1)] if folder else []
    )
    trainer = L.Trainer(
        max_epochs=100,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=every,
        enable_checkpointing=bool(folder),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), DataLoader(data, batch_size=256, shuffle=True))


if __name__ == "__main__":
    main()
