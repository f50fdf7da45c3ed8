from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks.errors import ExitStatus, SnapshotError
from checks.facts import BenchFacts, GpuBench, GpuProcess, RemappedRows
from checks.machine.resources import cpu_governor
from checks.result import Status
from checks.snapshot import SNAPSHOT_SCHEMA, dump_snapshot, load_snapshot, write_snapshot
from tests.factories import config, gpu, machine


def _facts():
    g = gpu(remapped_rows=RemappedRows(pending=True), processes=(GpuProcess(pid=7, used_memory=1024),))
    return machine(
        gpus=(g, gpu(1)),
        bench=BenchFacts(gpus=(GpuBench(index=0, h2d_gb_s=55.1),)),
        host={
            "env": {"CUDA_VISIBLE_DEVICES": "0"},
            "cuda_compat_paths": ("/x/compat",),
            # a dict of counts, not of strings: the snapshot reader once turned every dict value into a string,
            # and bootstrap --machine's cpu-governor check crashed on summing them
            "cpu_governors": {"performance": 12, "powersave": 4},
        },
    )


def test_round_trip_preserves_every_fact(tmp_path: Path) -> None:
    path = tmp_path / "box.json"
    write_snapshot(path, dump_snapshot(_facts(), recorded=True, description="two H100"))
    facts, header = load_snapshot(path)
    assert facts == _facts()
    assert header["snapshot"] == SNAPSHOT_SCHEMA and header["recorded"] is True
    assert header["description"] == "two H100"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_replayed_box_is_judged_like_the_recorded_one(tmp_path: Path) -> None:
    path = tmp_path / "box.json"
    write_snapshot(path, dump_snapshot(_facts(), recorded=True))
    facts, _ = load_snapshot(path)
    (live,) = cpu_governor(_facts(), config())
    (replayed,) = cpu_governor(facts, config())
    assert (
        replayed == live
        and replayed.status is Status.WARN
        and "4 of 16 CPUs on the powersave governor" in replayed.summary
    ), replayed


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    return path


def _doc(**machine_changes: object) -> dict:
    doc = dump_snapshot(machine(), recorded=False)
    doc["machine"].update(machine_changes)
    return doc


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="does not exist") as info:
        load_snapshot(tmp_path / "nope.json")
    assert info.value.code == ExitStatus.USAGE


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("{not json")
    with pytest.raises(SnapshotError, match="is not JSON"):
        load_snapshot(path)


def test_newer_format_is_refused_not_guessed(tmp_path: Path) -> None:
    doc = _doc()
    doc["snapshot"] = SNAPSHOT_SCHEMA + 1
    with pytest.raises(SnapshotError, match="newer than this tool"):
        load_snapshot(_write(tmp_path, doc))


def test_a_report_is_not_a_snapshot(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no 'machine' object"):
        load_snapshot(_write(tmp_path, {"schema": 1, "results": []}))


def test_unknown_field_is_named(tmp_path: Path) -> None:
    doc = _doc()
    doc["machine"]["nvml"]["gpus"][0]["power_limt_mw"] = 1
    with pytest.raises(SnapshotError, match=r"gpus\[0\]: unknown key 'power_limt_mw'"):
        load_snapshot(_write(tmp_path, doc))


def test_wrong_type_is_named(tmp_path: Path) -> None:
    doc = _doc()
    doc["machine"]["nvml"]["gpus"][0]["memory_total"] = "80GB"
    with pytest.raises(SnapshotError, match=r"memory_total: expected int"):
        load_snapshot(_write(tmp_path, doc))


def test_missing_required_field_is_an_error(tmp_path: Path) -> None:
    doc = _doc()
    del doc["machine"]["nvml"]["gpus"][0]["name"]
    with pytest.raises(SnapshotError, match="name"):
        load_snapshot(_write(tmp_path, doc))


def test_missing_optional_fields_take_defaults(tmp_path: Path) -> None:
    doc = {"snapshot": 1, "machine": {"nvml": {"gpus": [{"index": 0, "name": "NVIDIA L4"}]}, "torch": {}, "host": {}}}
    facts, _ = load_snapshot(_write(tmp_path, doc))
    assert facts.nvml.gpus[0].memory_total is None
    assert facts.host.hostname == "unknown"
