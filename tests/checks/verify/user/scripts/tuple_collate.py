"""A detection-style loop: each sample is an image and a dict of boxes, and the collate keeps samples apart
(``tuple(zip(*batch))``, as torchvision's detection references do): 2 samples a step, not 3 (the channels)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Boxes(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        image = torch.rand(3, 64, 64)
        return image, {"boxes": torch.tensor([[4.0, 4.0, 20.0, 20.0]]), "labels": torch.tensor([i % 3])}


model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Boxes(), batch_size=2, collate_fn=lambda batch: tuple(zip(*batch, strict=True)))
for images, targets in loader:
    logits = model(torch.stack(images))
    loss = nn.functional.cross_entropy(logits, torch.cat([t["labels"] for t in targets]))
    opt.zero_grad()
    loss.backward()
    opt.step()
