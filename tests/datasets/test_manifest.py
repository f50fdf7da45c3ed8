"""manifest.json as a typed record: the on-disk format of earlier versions reads and writes back byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datasets import manifest
from datasets.manifest import Manifest, Output
from datasets.stage import stage
from tests.datasets.jobs import request

RECORDED = Path(__file__).with_name("manifests")  # written by the dict-based writer before the typed record


@pytest.mark.parametrize("name", ["images-v1.json", "text-v1.json"])
def test_a_recorded_manifest_reads_and_writes_back_unchanged(name: str) -> None:
    text = (RECORDED / name).read_text()
    doc = Manifest.from_json(json.loads(text))
    assert json.dumps(doc.to_json(), indent=2) + "\n" == text


def test_a_recorded_images_manifest_has_its_fields_typed() -> None:
    doc = Manifest.from_json(json.loads((RECORDED / "images-v1.json").read_text()))
    c = doc.contents
    assert (c.kind, c.format, c.counts.inputs, c.counts.staged, c.counts.rejected) == ("images", "npy", 11, 6, 5)
    assert c.outputs["images.npy"] == Output(
        bytes=4736,
        sha256="b87fa46306a3f08991e644cf890f7e90012b4f5844d961ad608a07ae2b5919dd",
        shape=(6, 16, 16, 3),
        dtype="uint8",
    )
    assert c.outputs["classes.json"].shape is None and c.classes is not None and c.classes.per_class["dog"] == 2
    assert c.tokenizer is None and c.items_done_before == 0 and doc.source.layout == "imagefolder"


def test_a_recorded_text_manifest_has_a_tokenizer_and_no_classes() -> None:
    doc = Manifest.from_json(json.loads((RECORDED / "text-v1.json").read_text()))
    c = doc.contents
    assert c.tokenizer is not None and (c.tokenizer.name, c.tokenizer.dtype) == ("byte-level", "uint16")
    assert c.classes is None and c.items_done_before is None and c.counts.tokens == 55
    assert [r.reason for r in c.rejects] == ["not a JSON line"]


def test_a_staged_manifest_round_trips_and_holds_the_inventory(photo_tree: Path, tmp_path: Path) -> None:
    done = stage(request(photo_tree, tmp_path / "ds", images={"size": 16}, max_rejects="10", workers=1))
    on_disk = json.loads((done.dest / manifest.NAME).read_text())
    assert Manifest.from_json(on_disk) == done.manifest and done.manifest.to_json() == on_disk
    assert list(on_disk)[:9] == [
        "schema", "tool", "created", "kind", "format", "fingerprint", "source", "parameters", "counts",
    ]  # fmt: skip
    assert on_disk["source"] == {
        "spec": str(photo_tree), "scheme": "local", "identity": on_disk["source"]["identity"],
        "layout": "imagefolder", "files": 77, "bytes": on_disk["source"]["bytes"], "ignored": {},
    }  # fmt: skip
    assert "_inventory" not in on_disk and list(on_disk["timings"]) == [
        "fetch_s", "decode_s", "finalize_s", "total_s", "scan_s", "place_s", "workers_s",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"schema": 2}', '{"schema": 1, "kind": "images"}', '{"schema": 1, "outputs": 3}']
)
def test_an_unreadable_or_foreign_manifest_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / manifest.NAME).write_text(text)
    assert manifest.read(tmp_path) is None


def test_a_manifest_with_added_fields_still_reads(tmp_path: Path) -> None:
    doc = json.loads((RECORDED / "text-v1.json").read_text())
    doc["comment"] = "a later version added this"
    (tmp_path / manifest.NAME).write_text(json.dumps(doc))
    read = manifest.read(tmp_path)
    assert read is not None and read.contents.counts.staged == 5
