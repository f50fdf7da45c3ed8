"""The checkpoint a command wrote, read back as torch's default load reads it (``checks/verify/user/saved.py``,
``checks/probe/scripts/ckpt_contents.py``): real files saved with torch, read in the real child."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from checks.probe.torch import read_checkpoint
from checks.verify.events import Saved
from checks.verify.user.saved import contents_result, last_saved

pytestmark = pytest.mark.slow  # each read is a torch child (about 2 CPU-s of import)


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_a_checkpoint_with_every_part_a_resume_needs_reads_complete(tmp_path: Path) -> None:
    model, opt = _trained()
    path = tmp_path / "ckpt.pt"
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "loss": 0.42}
    torch.save(state | {"rng": torch.get_rng_state(), "sampler": {"seed": 7, "epoch": 3}}, path)
    contents = read_checkpoint(str(path), timeout=60)
    assert contents["model"]["tensors"] == 4 and contents["optimizer"] == {
        "key": "optimizer",
        "params": 4,
        "with_state": 4,
    }
    assert contents["position"] == {"epoch": 3.0} and contents["loss"]["value"] == 0.42
    row = contents_result(str(path), contents)
    assert row.status.value == "ok" and row.value == "complete"
    assert "model, optimizer, position, loss, rng, data" in row.summary


def test_a_bare_state_dict_misses_what_a_resume_needs(tmp_path: Path) -> None:
    model, _ = _trained()
    path = tmp_path / "weights.pt"
    torch.save(model.state_dict(), path)
    row = contents_result(str(path), read_checkpoint(str(path), timeout=60))
    assert row.status.value == "warn" and row.value == "incomplete"
    assert row.summary.endswith("missing optimizer, position, loss, rng, data")
    assert row.hint is not None and "Adam's moments" in row.hint


def test_a_checkpoint_torchs_default_load_refuses_is_said_with_what_it_refused(tmp_path: Path) -> None:
    model, opt = _trained()
    path = tmp_path / "numpy.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "loss": np.float64(0.42)}, path)
    row = contents_result(str(path), read_checkpoint(str(path), timeout=60))
    assert row.status.value == "warn" and row.value == "unreadable"
    assert "weights_only=True" in row.summary and "Unsupported global" in row.summary and "numpy" in row.summary


def test_the_last_file_saved_that_still_exists_is_the_one_read(tmp_path: Path) -> None:
    kept, gone = tmp_path / "a.pt", tmp_path / "b.pt"
    kept.write_bytes(b"x")
    events = [Saved(t=0.0, pid=1, path=str(kept)), Saved(t=0.0, pid=1, path=str(gone))]
    events.append(Saved(t=0.0, pid=2, path=str(kept)))  # another rank's
    assert last_saved(events, [1]) == str(kept) and last_saved(events, [3]) is None
