"""From the task's flags and the configuration to a Request; the summary line, also for a recorded manifest."""

from __future__ import annotations

import json
from pathlib import Path

from checks.config import make_config
from datasets.manifest import Manifest
from datasets.options import Flags, build_request, summary
from datasets.request import Outcome

RECORDED = Path(__file__).with_name("manifests")


def test_every_configured_value_reaches_the_request_and_flags_win() -> None:
    cfg = make_config({"stage": {"size": 128, "retries": 7, "dest_roots": ["/scratch"], "label_column": "y"}}).stage
    req = build_request(cfg, Flags(source="src"))
    assert (req.images.size, req.images.policy, req.images.resample) == (128, cfg.resize, cfg.resample)
    assert (req.fetch.retries, req.fetch.ssh_command, req.dest_roots) == (7, cfg.ssh_command, ("/scratch",))
    assert (req.columns.path, req.columns.label, req.reserve_cores, req.kind) == (
        "path",
        "y",
        cfg.reserve_cores,
        "auto",
    )
    flagged = build_request(cfg, Flags(source="src", size=64, reserve_cores=0, kind="images", token_dtype="uint32"))
    assert (flagged.images.size, flagged.reserve_cores, flagged.kind, flagged.text.token_dtype) == (
        64,
        0,
        "images",
        "uint32",
    )


def test_summary_of_a_recorded_manifest() -> None:
    images = Manifest.from_json(json.loads((RECORDED / "images-v1.json").read_text()))
    text = Manifest.from_json(json.loads((RECORDED / "text-v1.json").read_text()))
    line = summary(Outcome(dest=Path("/d"), noop=False, manifest=images), 1.0)
    assert line == "staged 6 images, 5 rejected into /d (0.0 MiB) in 1.0 s: 314 images/s"  # 11 inputs in 0.035 s
    assert summary(Outcome(dest=Path("/d"), noop=True, manifest=text), 0.5).startswith(
        "already staged: /d (5 documents"
    )
