"""The resume replay's judgement of the data apart from the checkpoint (``checks/verify/resume.py``), on the files
``templates/train.py`` writes: each process's ``same-RANK.json``, one ``{"indices", "inputs", "targets"}`` a batch.
The runs themselves are in test_planted_resume.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from checks.verify.builtin import Builtin
from checks.verify.resume import Replay, data_resume_result, same_batches

SAME = {"indices": True, "inputs": True, "targets": True}


def script(folder: Path, *ranks: list[dict[str, Any]], workers: int = 2) -> Builtin:
    """The tool's script as the replay reads it: its processes' comparisons written where it keeps its batches."""
    for rank, rows in enumerate(ranks):
        (folder / f"same-{rank}.json").write_text(json.dumps(rows))
    return cast(Builtin, SimpleNamespace(processes=len(ranks), keep_dir=str(folder), loader={"num_workers": workers}))


def replayed(b: Builtin) -> Replay:
    return Replay("last.pt", 2, (1.0, 0.9), (1.0, 0.9), 1.0, 0.0, fed=True, data=same_batches(b))


def test_a_batch_one_rank_drew_otherwise_is_a_difference_of_the_whole_run(tmp_path: Path) -> None:
    b = script(tmp_path, [SAME, SAME], [SAME, {**SAME, "inputs": False}])
    d = same_batches(b)
    assert d is not None and (d.batches, d.exact, d.order_same, d.first_difference) == (2, False, True, 1)
    assert d.differs == ("inputs",) and d.workers == 2
    row = data_resume_result(b, replayed(b))
    assert row.status.value == "warn" and "2 DataLoader worker(s)" in row.summary, row.summary
    assert "index and epoch" in (row.hint or "")


def test_other_samples_are_a_sampler_that_does_not_resume(tmp_path: Path) -> None:
    b = script(tmp_path, [{"indices": False, "inputs": False, "targets": False}], workers=0)
    row = data_resume_result(b, replayed(b))
    assert row.status.value == "warn" and "the sample order does not resume" in row.summary, row.summary


def test_the_same_batches_are_ok_and_nothing_compared_is_a_skip(tmp_path: Path) -> None:
    b = script(tmp_path, [SAME, SAME])
    assert data_resume_result(b, replayed(b)).status.value == "ok"
    (tmp_path / "same-0.json").unlink()  # the resumed script ended before its first batch
    assert same_batches(b) is None and data_resume_result(b, replayed(b)).status.value == "skip"


def test_a_command_is_told_data_resume_is_the_tool_scripts() -> None:
    row = data_resume_result(None, None)
    assert row.status.value == "skip" and "checked only for the tool's script" in row.summary
