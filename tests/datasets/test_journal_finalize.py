"""The journal (torn lines, lock), the fixed-header .npy writer, and crash-safe compaction and sharding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from datasets import finalize, npyfile
from datasets.errors import StageFailure
from datasets.journal import Journal, locked
from datasets.stage import stage
from tests.datasets.jobs import crash_on, request


def test_torn_last_line_is_dropped_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"event":"start","fingerprint":"f"}\n{"event":"chunk","start":0,"stop"')
    journal = Journal(path)
    assert journal.fingerprint == "f" and len(journal.events) == 1
    journal.append({"event": "planned"})
    assert [json.loads(x)["event"] for x in path.read_text().splitlines()] == ["start", "planned"]


def test_second_run_on_the_same_destination_is_refused(tmp_path: Path) -> None:
    with (
        locked(tmp_path / "lock"),
        pytest.raises(StageFailure, match="another stage-data run"),
        locked(tmp_path / "lock"),
    ):
        pass


@pytest.mark.parametrize("shape", [(0, 4, 4, 3), (7,), (12345678901, 2, 2, 3)])
def test_fixed_header_is_a_valid_npy_header(tmp_path: Path, shape: tuple[int, ...]) -> None:
    head = npyfile.header(np.dtype("<u2"), shape)
    assert len(head) == npyfile.HEADER_BYTES
    (tmp_path / "a.npy").write_bytes(head)
    with (tmp_path / "a.npy").open("rb") as fh:
        np.lib.format.read_magic(fh)
        assert np.lib.format.read_array_header_1_0(fh)[0] == shape


def test_rewrite_shape_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    npyfile.create(path, np.dtype("<u4"), (10,))
    with path.open("r+b") as fh:
        fh.seek(npyfile.HEADER_BYTES)
        fh.write(np.arange(10, dtype="<u4").tobytes())
    npyfile.rewrite_shape(path, np.dtype("<u4"), (6,))
    assert np.load(path).tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "event"), [("npy", "compact"), ("pt", "shard")])
def test_crash_while_finishing_resumes_to_the_same_bytes(
    photo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, event: str
) -> None:
    if fmt == "pt":
        pytest.importorskip("torch")
    monkeypatch.setattr(finalize, "BLOCK_ROWS", 7)  # many compaction steps
    base = request(
        photo_tree,
        tmp_path / "straight",
        format=fmt,
        images={"size": 24, "shard_size": 10},
        max_rejects="10",
        workers=1,
    )
    straight = stage(base).dest
    crash_on(monkeypatch, event, 3)
    with pytest.raises(KeyboardInterrupt):
        stage(dataclasses.replace(base, dest=str(tmp_path / "ds")))
    monkeypatch.undo()
    monkeypatch.setattr(finalize, "BLOCK_ROWS", 7)
    resumed = stage(dataclasses.replace(base, dest=str(tmp_path / "ds")))
    assert "resuming an unfinished run" in resumed.notes
    for name in sorted(p.name for p in straight.iterdir() if p.name != "manifest.json"):
        assert (resumed.dest / name).read_bytes() == (straight / name).read_bytes(), name


def test_good_rows() -> None:
    assert finalize.good_rows(6, {1, 4}).tolist() == [0, 2, 3, 5]
