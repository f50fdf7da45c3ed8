"""The copy-paste Dataset in templates/ reads a staged folder through a real DataLoader with workers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from datasets.stage import stage, verify
from tests.datasets.jobs import request

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "staged_dataset.py"


def load_template():
    spec = importlib.util.spec_from_file_location("staged_dataset", TEMPLATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_template_is_short_and_needs_only_numpy_and_torch() -> None:
    text = TEMPLATE.read_text()
    assert len(text.splitlines()) <= 40
    imports = {line.split()[1].split(".")[0] for line in text.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"json", "collections", "pathlib", "typing", "numpy", "torch"}


@pytest.mark.slow
def test_dataloader_with_workers_reads_the_staged_samples(photo_tree: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dest = stage(request(photo_tree, tmp_path / "ds", images={"size": 32}, max_rejects="10")).dest
    dataset = load_template().StagedImages(dest)
    assert len(dataset) == 72 and dataset.classes == ["cat", "dog", "fish"]
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2)
    images = torch.cat([batch for batch, _ in loader])
    labels = torch.cat([lab for _, lab in loader])
    assert images.shape == (72, 32, 32, 3) and images.dtype == torch.uint8
    assert (images.numpy() == np.load(dest / "images.npy")).all()
    assert verify(dest) == []  # copy-on-write mapping: reading never changed the file
    assert labels.tolist() == np.load(dest / "labels.npy").tolist()
