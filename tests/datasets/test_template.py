"""The copy-paste reader in templates/ over a real staged folder: the DataLoader Dataset and ``staged_loader``."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from datasets.stage import stage, verify
from tests.datasets.jobs import request

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "staged_dataset.py"


@pytest.fixture
def torch() -> ModuleType:
    return pytest.importorskip("torch")


def load_template() -> Any:
    """The template as a module (it imports torch: the test skips with the reason where torch is missing)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("staged_dataset", TEMPLATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def staged(photo_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """72 real photos (scikit-image's, re-encoded) staged at 32 px: 4 full batches of 16 and one of 8."""
    dest = tmp_path_factory.mktemp("staged") / "ds"
    return stage(request(photo_tree, dest, images={"size": 32}, max_rejects="10")).dest


def arrays(root: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(root / "images.npy"), np.load(root / "labels.npy")


def test_template_is_one_file_that_needs_only_numpy_and_torch() -> None:
    text = TEMPLATE.read_text()
    imports = {line.split()[1].split(".")[0] for line in text.splitlines() if line.startswith(("import ", "from "))}
    stdlib = {"__future__", "json", "sys", "threading", "collections", "pathlib", "typing"}
    assert imports - stdlib == {"numpy", "torch"}


@pytest.mark.slow
def test_dataloader_with_workers_reads_the_staged_samples(staged: Path, torch: ModuleType) -> None:
    dataset = load_template().StagedImages(staged)
    assert len(dataset) == 72 and dataset.classes == ["cat", "dog", "fish"]
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=2)
    images = torch.cat([batch for batch, _ in loader])
    labels = torch.cat([lab for _, lab in loader])
    assert images.shape == (72, 32, 32, 3) and images.dtype == torch.uint8
    assert (images.numpy() == np.load(staged / "images.npy")).all()
    assert verify(staged) == []  # copy-on-write mapping: reading never changed the file
    assert labels.tolist() == np.load(staged / "labels.npy").tolist()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_unshuffled_batches_are_the_file_in_order_with_a_last_partial_batch(
    staged: Path, workers: int, torch: ModuleType
) -> None:
    loader = load_template().staged_loader(staged, 16, shuffle=False, workers=workers)
    batches = [(x.clone(), y.clone()) for x, y in loader]
    images, labels = arrays(staged)
    assert [len(x) for x, _ in batches] == [16, 16, 16, 16, 8] == [len(y) for _, y in batches]
    assert batches[0][0].dtype == torch.uint8 and batches[0][1].dtype == torch.int64
    assert (torch.cat([x for x, _ in batches]).numpy() == images).all()
    assert torch.cat([y for _, y in batches]).tolist() == labels.tolist()
    assert verify(staged) == []  # reading never wrote the file


def test_drop_last_leaves_out_the_partial_batch(staged: Path) -> None:
    loader = load_template().staged_loader(staged, 16, shuffle=False, drop_last=True)
    assert len(loader) == 4 and [len(x) for x, _ in loader] == [16, 16, 16, 16]


def epoch_indices(loader: Any) -> list[list[int]]:
    """The batches of one pass, as the indices of images.npy they hold (each image is matched to its row)."""
    images, _ = arrays(loader_root(loader))
    out = []
    for x, y in loader:
        rows = [int(np.flatnonzero((images == img).all(axis=(1, 2, 3)))[0]) for img in x.numpy()]
        assert y.tolist() == np.load(loader_root(loader) / "labels.npy")[rows].tolist()
        out.append(rows)
    return out


def loader_root(loader: Any) -> Path:
    return Path(loader.images.filename).parent


def test_shuffle_is_a_sorted_permutation_per_epoch_decided_by_the_seed(staged: Path) -> None:
    images, _ = arrays(staged)
    assert len({img.tobytes() for img in images}) == len(images)  # every row is told apart by its pixels
    make = load_template().staged_loader
    a, b, other = make(staged, 16, seed=3), make(staged, 16, seed=3, workers=2), make(staged, 16, seed=4)
    first, again, different = epoch_indices(a), epoch_indices(b), epoch_indices(other)
    assert first == again and first != different
    assert sorted(i for batch in first for i in batch) == list(range(72))  # each sample once per epoch
    assert all(batch == sorted(batch) for batch in first) and [len(x) for x in first] == [16, 16, 16, 16, 8]
    assert [i for batch in first for i in batch] != list(range(72))  # not the file order
    second = epoch_indices(a)  # the pass after a whole epoch is the next epoch, with its own order
    assert a.epoch == 2 and second != first and second == epoch_indices_of(make(staged, 16, seed=3), epoch=1)


def epoch_indices_of(loader: Any, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return epoch_indices(loader)


def test_a_loader_rebuilt_from_the_state_yields_what_the_uninterrupted_run_would(
    staged: Path, torch: ModuleType
) -> None:
    make = load_template().staged_loader
    whole = make(staged, 16, seed=9, workers=1)
    whole.set_epoch(5)
    expected = [x.clone() for x, _ in whole]
    interrupted = make(staged, 16, seed=9, workers=1)
    interrupted.set_epoch(5)
    it = iter(interrupted)
    seen = [next(it)[0].clone() for _ in range(2)]
    state = interrupted.state_dict()
    assert state["epoch"] == 5 and state["position"] == 2
    resumed = make(staged, 16, workers=1)  # no seed given: the state's seed decides the order
    resumed.load_state_dict(state)
    resumed.set_epoch(5)  # the training loop's call for the epoch it stands in continues it
    rest = [x.clone() for x, _ in resumed]
    assert len(seen) + len(rest) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(seen + rest, expected, strict=True))
    assert resumed.state_dict() == {"seed": 9, "epoch": 6, "position": 0}


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_batch_stays_intact_until_keep_more_are_taken_and_its_buffer_is_reused(staged: Path, workers: int) -> None:
    module = load_template()
    loader = module.staged_loader(staged, 16, shuffle=False, workers=workers)
    images, _ = arrays(staged)
    it = iter(loader)
    held = [next(it)[0] for _ in range(module.KEEP)]  # the current batch and those before it, within the rule
    # A stall to provoke, not a wait: reading threads that broke the rule would overwrite a held batch in this
    # time; ones that keep it only stop, so there is no event to wait for.
    time.sleep(0.3)
    for k, batch in enumerate(held):
        assert (batch.numpy() == images[16 * k : 16 * (k + 1)]).all(), f"batch {k} was overwritten within the rule"
    later = [next(it)[0] for _ in range(loader.ring - module.KEEP)]
    ring = held + later
    pointers = {t.data_ptr() for t in ring}
    assert len(pointers) == loader.ring  # distinct buffers while held ...
    loader2 = module.staged_loader(staged, 8, shuffle=False, workers=workers)
    ptrs = [x.data_ptr() for x, _ in loader2]  # 9 batches through a ring of 3 or 4: ... reused, not allocated
    assert len(set(ptrs)) == loader2.ring and ptrs[loader2.ring :] == ptrs[: len(ptrs) - loader2.ring]


def test_images_and_labels_of_different_lengths_are_refused(staged: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("labels.npy", "classes.json"):
        (broken / name).write_bytes((staged / name).read_bytes())
    np.save(broken / "images.npy", np.zeros((8, 32, 32, 3), np.uint8))  # 8 rows for 72 labels
    with pytest.raises(ValueError, match=r"images\.npy holds 8 images for 72 labels"):
        load_template().staged_loader(broken, 16)


def test_an_error_in_the_reading_thread_reaches_the_caller(staged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = load_template().staged_loader(staged, 16, shuffle=False, workers=1)
    fill = loader._fill

    def failing(index: np.ndarray, slot: int) -> Any:
        if index[0] >= 32:
            raise OSError("Input/output error")  # what a failing disk under the memory map raises
        return fill(index, slot)

    monkeypatch.setattr(loader, "_fill", failing)
    it = iter(loader)
    assert len(next(it)[0]) == 16 and len(next(it)[0]) == 16
    with pytest.raises(OSError, match="Input/output error"):
        next(it)
    assert loader.state_dict()["position"] == 2  # the failed batch was not counted as taken
