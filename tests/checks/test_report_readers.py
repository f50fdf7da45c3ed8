"""Every report the repository holds is read back by the typed readers, and a broken one is refused in one line.

The readers: ``Report.from_json`` (``read_report`` for a file) for every report, bootstrap's
``BootstrapMeasurements.from_json`` (``read_measurements`` for a file: ``invoke diff``) and verify's
``Measurements.from_json`` for their ``measurements``, the job's ``NodeRecord``. The reports: bootstrap's of every
machine fixture, the sample in docs/formats.md, verify's golden files (``tests/checks/verify/golden``, what the
judge writes for each recorded run), and the schema those are held to.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from checks.env.view import load_side
from checks.errors import PreflightError
from checks.fleet.job import NodeRecord, node_records
from checks.machine.bootstrap import BootstrapRequest, bootstrap
from checks.plan.timing import read_report as read_verify_baseline
from checks.reports.bootstrap import BootstrapMeasurements, read_measurements
from checks.reports.verify import CommandStep, Measurements, StepBlock
from checks.result import REPORT_SCHEMA, Report, Result, read_report
from checks.typedjson import ContractError, TypedJsonError
from tests.checks.verify.report_schema import SCHEMA
from tests.factories import config

REPO = Path(__file__).resolve().parents[2]
MACHINES = sorted((REPO / "tests" / "fixtures" / "machines").glob("*.json"))
GOLDEN = sorted((REPO / "tests" / "checks" / "verify" / "golden").glob("*.json"))


def _bootstrap_json(machine: Path) -> dict[str, Any]:
    report = bootstrap(BootstrapRequest(config(), machine=machine)).report
    return dict(json.loads(json.dumps(report.to_json())))


def _verify_report(golden: Path) -> dict[str, Any]:
    doc = json.loads(golden.read_text(encoding="utf-8"))
    return {"schema": REPORT_SCHEMA, "tool": "gpu-preflight", "host": "box-a", "machine": "live"} | {
        "counts": {},
        "results": doc["results"],
        "measurements": doc["measurements"],
    }


@pytest.mark.parametrize("machine", MACHINES, ids=lambda p: p.stem)
def test_bootstraps_report_of_every_machine_fixture_reads_back_whole(machine: Path) -> None:
    """The report and its measurements, typed: what the writer wrote is what the records write back (a whole number
    in a float field, nccl.yaml's expected busbw, reads back as the equal float)."""
    done = bootstrap(BootstrapRequest(config(), machine=machine))
    data = dict(json.loads(json.dumps(done.report.to_json())))
    report = Report.from_json(data, machine.name)
    assert report.to_json() == data
    measured = read_measurements(report, machine.name)
    assert measured.to_json() == data["measurements"]
    assert list(measured.to_json()) == list(data["measurements"])  # the keys in the order the writer wrote them
    assert measured == done.measurements  # the record the writer built, read back equal


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_every_golden_verify_report_reads_back_through_report_and_measurements(golden: Path) -> None:
    data = _verify_report(golden)
    report = Report.from_json(data, golden.name)
    assert [r.to_json() for r in report.results] == data["results"]
    measurements = Measurements.from_json(report.measurements, f"{golden.name}.measurements")
    assert measurements.to_json() == data["measurements"]


def test_the_sample_report_of_formats_md_is_a_report() -> None:
    text = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    sample = re.search(r"## JSON report.*?```json\n(.*?)```", text, re.S)
    assert sample is not None
    report = Report.from_json(json.loads(sample.group(1)), "docs/formats.md")
    measured = read_measurements(report, "docs/formats.md")
    assert report.results and measured.inventory.gpus == 1 and measured.gpu_bench and measured.pcie_under_load
    assert measured.to_json() == report.measurements


def test_the_typed_readers_know_every_key_of_the_verify_report_schema() -> None:
    """The schema the reports are held to and the records that read them name the same keys."""
    own = {f.name for f in dataclasses.fields(Measurements)} - {"steps", "command_step"}
    lifted = {f.name for cls in (StepBlock, CommandStep) for f in dataclasses.fields(cls)}
    assert set(SCHEMA["properties"]["measurements"]["properties"]) == own | lifted
    result = SCHEMA["properties"]["results"]["items"]["properties"]
    assert set(result) == {f.name for f in dataclasses.fields(Result)}


def test_a_report_of_another_schema_is_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_bootstrap_json(MACHINES[0]) | {"schema": 0}), encoding="utf-8")
    with pytest.raises(PreflightError) as refused:
        read_report(path, "a bootstrap --json report")
    line = str(refused.value)
    assert (
        "\n" not in line and str(path) in line and f"rerun bootstrap or verify to write schema {REPORT_SCHEMA}" in line
    )


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (lambda d: d.pop("host"), r"r\.json: missing key 'host'"),
        (lambda d: d["results"][0].pop("status"), r"r\.json\.results\[0\]: .*'status'"),
        (lambda d: d["results"][1].update(status="bad"), r"r\.json\.results\[1\]\.status: expected one of ok, "),
        (lambda d: d["results"][0].update(duration_s="1"), r"r\.json\.results\[0\]\.duration_s: expected float"),
        (lambda d: d.update(timing={"seconds": 1.0, "phases": [{"start_s": 0}]}), r"r\.json\.timing\.phases\[0\]"),
        (lambda d: d.update(hosts=[]), r"r\.json: unknown key 'hosts'"),
    ],
)
def test_a_report_missing_a_key_or_with_a_wrong_type_is_refused_naming_the_path(broken: Any, message: str) -> None:
    data = _bootstrap_json(MACHINES[0])
    broken(data)
    with pytest.raises(TypedJsonError, match=message):
        Report.from_json(data, "r.json")


def test_verify_measurements_missing_a_key_or_with_a_wrong_type_are_refused_naming_the_path() -> None:
    m = _verify_report(GOLDEN[0])["measurements"]
    with pytest.raises(ContractError, match=r"m\.step_time\.median_s: expected float"):
        Measurements.from_json(m | {"step_time": m["step_time"] | {"median_s": "fast"}}, "m")
    with pytest.raises(ContractError, match=r"m: .*'files'"):
        Measurements.from_json({k: v for k, v in m.items() if k != "files"}, "m")
    with pytest.raises(ContractError, match=r"m: .*'samples_per_s'"):  # the step figures come together or not at all
        Measurements.from_json({k: v for k, v in m.items() if k != "samples_per_s"}, "m")
    with pytest.raises(ContractError, match="m: unknown key 'steps'"):
        Measurements.from_json(m | {"steps": {}}, "m")


def test_plan_from_reads_a_verify_report_or_refuses_it_in_one_line(tmp_path: Path) -> None:
    golden = next(p for p in GOLDEN if p.stem == "a100-fragmented")
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(_verify_report(golden)), encoding="utf-8")
    base = read_verify_baseline(path)
    assert base.host == "box-a" and base.precision == "bf16" and base.per_sample_s > 0
    broken = _verify_report(golden)
    broken["measurements"]["run"]["device"] = "cuda"
    path.write_text(json.dumps(broken), encoding="utf-8")
    with pytest.raises(PreflightError, match=re.escape(f"{path}.measurements.run.device: expected a JSON object")):
        read_verify_baseline(path)


def test_a_nodes_record_in_a_job_crosses_as_text_and_reads_back_typed() -> None:
    report = Report.from_json(_bootstrap_json(MACHINES[0]))
    record = NodeRecord("n1", report, 4.2, report.exit_code())
    back = NodeRecord.from_json(json.loads(json.dumps(record.to_json())), "node 0's record")
    assert back.report is not None and back.report.to_json() == report.to_json()
    assert back.outcome().status == "ok" and NodeRecord("n2", None, 0.0, reason="x").outcome().status == "fail"
    with pytest.raises(ContractError, match=r"node 0's record\.report\.results\[0\]\.id: expected str"):
        data = record.to_json()
        data["report"]["results"][0]["id"] = 7
        NodeRecord.from_json(data, "node 0's record")


BROKEN_BOOTSTRAP = [
    (lambda m: m["inventory"].pop("cuda"), r"measurements\.inventory: .*'cuda'"),
    (lambda m: m.pop("dataloader"), r"measurements: .*'dataloader'"),
    (lambda m: m.update(env=m.pop("environment")), r"measurements: unknown key 'env'"),
    (lambda m: m["environment"].update(drivers=m["environment"].pop("driver")), r"environment: unknown key 'drivers'"),
    (lambda m: m["gpu_bench"][0].update(h2d_gb_s="55"), r"measurements\.gpu_bench\[0\]\.h2d_gb_s: expected float"),
    (lambda m: m["environment"]["packages"].update(numpy=2), r"environment\.packages\.numpy: expected str"),
    (lambda m: m["pcie_under_load"]["gpu0"].pop("gen"), r"pcie_under_load\.gpu0: .*'gen'"),
]
HEALTHY = next(p for p in MACHINES if p.stem == "h100-sxm-8x-healthy")


@pytest.mark.parametrize(("broken", "message"), BROKEN_BOOTSTRAP)
def test_bootstraps_measurements_with_a_key_missing_renamed_or_mistyped_are_refused_in_one_line(
    tmp_path: Path, broken: Any, message: str
) -> None:
    """At the file's boundary (``invoke diff``): one line naming the file, the path to the key, and what to do."""
    data = _bootstrap_json(HEALTHY)
    broken(data["measurements"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(PreflightError) as refused:
        load_side(str(path))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"gpu-preflight: {path}.measurements"), line
    assert re.search(message, line) and line.endswith("rerun invoke bootstrap --json)"), line


def test_a_report_older_than_the_environment_block_is_read_and_a_verify_report_refused(tmp_path: Path) -> None:
    data = _bootstrap_json(HEALTHY)
    del data["measurements"]["environment"]
    old = read_measurements(Report.from_json(data), "old.json")
    assert old.environment is None and old.inventory.gpus == 8 and "environment" not in old.to_json()
    verify = Report.from_json(_verify_report(GOLDEN[0]))
    with pytest.raises(PreflightError, match=r"^gpu-preflight: v\.json is a verify report, not bootstrap's"):
        read_measurements(verify, "v.json")
    assert BootstrapMeasurements.from_json(data["measurements"]) == old


def test_a_nodes_record_whose_report_is_not_bootstraps_is_refused_whole() -> None:
    """The job's exchange is a boundary too: a node's record is read whole, its measurements included."""
    report = Report.from_json(_bootstrap_json(MACHINES[0]))
    data = NodeRecord("n1", report, 4.2, report.exit_code()).to_json()
    data["report"]["measurements"]["inventory"]["gpu_names"] = "H100"
    with pytest.raises(
        ContractError, match=r"node 0's record\.report\.measurements\.inventory\.gpu_names: expected a list"
    ):
        NodeRecord.from_json(data, "node 0's record")
    with pytest.raises(
        PreflightError, match=re.escape("a node's record cannot be read: node 0's record.report.measurements")
    ):
        node_records({"0": json.dumps(data)})
