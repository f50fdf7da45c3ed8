"""From the task's flags and the configuration to a Request; the summary line, also for a recorded manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks.config import make_config
from checks.errors import ExitStatus
from datasets.errors import UsageError
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


def _outcome(kind: str, inputs: int, staged: int, rejected: int, tokens: int, before: int | None) -> Outcome:
    doc = json.loads((RECORDED / f"{kind}-v1.json").read_text())
    doc["counts"] = {"inputs": inputs, "staged": staged, "rejected": rejected, "tokens": tokens}
    doc["timings"]["decode_s"] = 0.5
    doc["resumed"] = {"items_done_before": before}
    return Outcome(dest=Path("/d"), noop=False, manifest=Manifest.from_json(doc))


def test_summary_after_a_resume_says_what_was_done_earlier_and_the_rate_of_what_was_done_now() -> None:
    everything_earlier = summary(_outcome("images", 16, 15, 1, 0, 16), 0.1)
    assert everything_earlier.startswith("staged 15 images, 1 rejected into /d")
    assert everything_earlier.endswith(
        "in 0.1 s: resumed: all 16 images were decoded by an earlier run, none left for this one"
    )
    part = summary(_outcome("images", 1000, 1000, 0, 0, 600), 2.0)
    assert part.endswith("resumed: 600 images decoded by an earlier run, 400 now at 800 images/s")  # 400 in 0.5 s
    text = summary(_outcome("text", 3, 3, 0, 5000, 4000), 1.0)
    assert text.endswith("resumed: 4,000 tokens tokenized by an earlier run, 1,000 now at 2,000 tokens/s")


def test_summary_counts_one_of_a_thing_in_the_singular() -> None:
    one = summary(_outcome("images", 2, 1, 1, 0, 0), 1.0)
    assert one.startswith("staged 1 image, 1 rejected into /d") and one.endswith(": 4 images/s")
    text = summary(_outcome("text", 1, 1, 0, 1, 0), 1.0)
    assert text.startswith("staged 1 token from 1 document into")
    noop = summary(Outcome(dest=Path("/d"), noop=True, manifest=_outcome("images", 1, 1, 0, 0, 0).manifest), 0.2)
    assert noop.startswith("already staged: /d (1 image,")


def test_negative_worker_and_reserve_counts_are_refused_naming_the_flag() -> None:
    """``--workers -2`` was accepted before. 0 workers is documented (the usable cores less reserve_cores), and
    -1 is the task's own "from the configuration" for --reserve-cores."""
    cfg = make_config().stage
    for flags, needle in (
        (Flags(source="src", workers=-2), "--workers -2 is negative"),
        (Flags(source="src", workers=-1), "--workers -1 is negative"),
        (Flags(source="src", reserve_cores=-2), "--reserve-cores -2 is negative"),
    ):
        with pytest.raises(UsageError, match=needle) as caught:
            build_request(cfg, flags)
        assert caught.value.code == ExitStatus.USAGE and "\n" not in caught.value.message
        assert caught.value.hint and caught.value.hint.startswith("pass ")
    assert build_request(cfg, Flags(source="src", workers=0)).workers == 0
    assert build_request(cfg, Flags(source="src", workers=3, reserve_cores=0)).workers == 3
