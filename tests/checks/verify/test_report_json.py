"""verify's JSON report cannot drift: representative runs judged to the same JSON as recorded, and a schema.

``golden/`` holds what the command's judge wrote for each case of ``verify_cases.py`` (recorded child results as
the agent's lines, and recorded ``verify -- COMMAND`` runs); ``verify_report.schema.json`` holds every key a report's ``results`` and ``measurements`` may have, and which are
always there. The validator is the small subset of JSON Schema the file uses (type, properties, required,
additionalProperties, items).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from checks.reports.verify import Measurements
from checks.typedjson import ContractError
from checks.verify.contract import ChildResult
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.checks.verify.verify_cases import ALL, GOLDEN, RUNS, judged

REPO = Path(__file__).resolve().parents[3]


def same(a: Any, b: Any) -> bool:
    """Equal JSON, NaN equal to NaN (a NaN loss is a figure, not a difference)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


@pytest.mark.parametrize("name", ALL)
def test_a_run_is_judged_to_the_json_recorded_before_the_contract(name: str) -> None:
    golden = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert same(judged(name), golden)


@pytest.mark.parametrize("name", ALL)
def test_a_judged_runs_measurements_read_back_by_the_typed_reader_to_the_same_json(name: str) -> None:
    """``Measurements.from_json`` inverts ``to_json`` exactly: the same keys, in the same order, the same values."""
    m = judged(name)["measurements"]
    back = json.loads(json.dumps(Measurements.from_json(m).to_json(), default=str))
    assert list(back) == list(m) and same(back, m)


@pytest.mark.parametrize("name", ALL)
def test_a_judged_run_meets_the_report_schema(name: str) -> None:
    doc = judged(name)
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []


def test_the_schema_rejects_an_unknown_key_a_missing_one_and_a_wrong_type() -> None:
    doc = judged("cpu-data-bound")
    m = doc["measurements"]
    assert violations({"results": doc["results"], "measurements": m | {"step_tim": {}}}, SCHEMA) == [
        "$.measurements: unknown key 'step_tim'"
    ]
    del m["files"]
    m["run"]["seconds"] = "12"
    assert violations({"results": doc["results"], "measurements": m}, SCHEMA) == [
        "$.measurements: missing key 'files'",
        "$.measurements.run.seconds: str where number is expected",
    ]


def test_every_measurement_key_is_documented_in_formats_md() -> None:
    text = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    section = text[text.index("## Verify and watch outputs") :]
    named = set(re.findall(r"`([a-z_0-9]+)`", section))
    assert sorted(set(SCHEMA["properties"]["measurements"]["properties"]) - named) == []


@pytest.mark.parametrize("name", ["cpu-data-bound", "cpu-ddp-gloo"])
def test_a_recorded_result_reads_into_the_records_and_back(name: str) -> None:
    """A recorded run's result (the shape the verdict rules read) parses into ``ChildResult`` and back."""
    doc = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    result = ChildResult.from_json(doc["result"])
    assert result.steps and result.checkpoint is not None and result.checkpoint.reproduced is not None
    back = ChildResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.to_json().keys() == result.to_json().keys() and len(back.steps) == len(result.steps)
    assert (len(result.ranks), result.ddp is not None) == ((2, True) if "ddp" in name else (0, False))


def test_a_result_with_an_unknown_key_is_not_a_child_result() -> None:
    with pytest.raises(ContractError, match="ChildResult: unknown key 'step'"):
        ChildResult.from_json({"step": []})
    with pytest.raises(ContractError, match=r"ChildResult\.checkpoint\.data\.exact: expected bool"):
        ChildResult.from_json({"checkpoint": {"data": {"batches": 2, "exact": "yes", "order_same": True}}})
