"""The suite's own scheduling (tests/conftest.py): files go to the xdist workers heaviest first."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tests.conftest import FILE_SECONDS, heaviest_first


def _items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_heavier_files_come_first_and_keep_their_tests_order() -> None:
    items = _items("a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2")
    out = [i.nodeid for i in heaviest_first(items, {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0})]
    assert out == ["b.py::t1", "c.py::t1", "c.py::t2", "a.py::t1", "a.py::t2"]


def test_an_unrecorded_file_weighs_the_median_and_ties_keep_the_collection_order() -> None:
    items = _items("new.py::t", "x.py::t", "y.py::t", "z.py::t", "w.py::t")
    seconds = {"x.py": 1.0, "y.py": 9.0, "z.py": 4.0, "w.py": 4.0}
    assert [i.nodeid for i in heaviest_first(items, seconds)] == [
        "y.py::t",
        "new.py::t",  # the median, 4.0: ties with z and w, and was collected before them
        "z.py::t",
        "w.py::t",
        "x.py::t",
    ]
    assert [i.nodeid for i in heaviest_first(items, {})] == [i.nodeid for i in items]


def test_the_recorded_seconds_name_test_files_that_exist() -> None:
    recorded = json.loads(FILE_SECONDS.read_text())
    root = FILE_SECONDS.parent.parent
    missing = [f for f in recorded if not (root / f).is_file()]
    assert recorded and not missing, f"stale entries in {FILE_SECONDS.name}: {missing} (pytest --record-file-seconds)"
