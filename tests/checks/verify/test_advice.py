"""Measured advice on real pipelines, trained for real on the CPU: the verdict, and that the advised loader setting
was measured faster in that same run (from the JSON measurements a script would read).

- memory-mapped samples through workers: fewer workers are truly faster (the hand-off costs more than the read);
- real JPEG photos decoded and blurred in the training process: more workers are faster (CPU work per sample);
- the same CPU-heavy pipeline saturating the cores beside a real neighbour taking ~10% of one core: it is ours.

The box has 2 cores that other jobs share, so the assertions are on the measured ratios verify itself computed,
with margins (``advice_min_gain``), never on absolute rates.

The loader is timed for the shortest budget that still proves each point (``loader_probe_s``: at least 0.4 s per
candidate whatever the budget, ``MIN_CANDIDATE_S``); the memory-mapped run is one, read by its two tests.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.config import make_config
from checks.result import Result
from checks.verify.plan import Outcome
from tests.fakes.smoke import PLUGINS, config, smoke
from tests.fakes.verdicts import planted_row

pytestmark = [pytest.mark.slow, pytest.mark.measures]
GAIN = make_config().verify.advice_min_gain
Smoked = tuple[Outcome, dict[str, Result], dict[str, Any]]


def measured(m: dict[str, Any]) -> tuple[dict[str, Any], dict[tuple[int, bool], float]]:
    """The advice and the candidates' rates by (num_workers, pin_memory), checked against each other."""
    advice = m["advice"]
    rates = {(c["num_workers"], c["pin_memory"]): c["samples_s"] for c in m["loader_candidates"]}
    assert set(advice) >= {"num_workers", "pin_memory", "measured_samples_s", "current_samples_s"}
    assert rates[(advice["num_workers"], advice["pin_memory"])] == advice["measured_samples_s"]
    return advice, rates


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Smoked:
    """Memory-mapped 196 KB samples through two workers, the loader timed at its minimum per candidate."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        return smoke(
            tmp_path_factory.mktemp("mapped"),
            monkeypatch,
            config(steps=30, loader_probe_s=1.5),
            dataset=f"{PLUGINS}:mapped",
            model=f"{PLUGINS}:strided_model",
            workers=2,
        )


def test_memory_mapped_samples_through_workers_are_bound_by_the_hand_off(mapped: Smoked) -> None:
    # Reads from a memory map are cheap; two workers copy every 196 KB sample into shared memory once more.
    _, _results, m = mapped
    verdict = planted_row(m)
    alone = m["loader_alone"]
    assert alone["workers"] == 2 and alone["in_process_samples_s"] >= 1.5 * alone["samples_s"], alone
    assert planted_row(m)["id"] == "data-bound", verdict
    assert verdict["fix"].startswith("use num_workers=0") and "hand-off is the limit" in verdict["summary"]
    assert verdict["evidence"]["loader_alone"] == alone


def test_memory_mapped_samples_advise_fewer_workers_measured_faster(mapped: Smoked) -> None:
    _, _results, m = mapped
    verdict = planted_row(m)
    assert planted_row(m)["id"] == "data-bound", verdict
    advice, rates = measured(m)
    assert advice["faster"] and advice["num_workers"] < 2, m["loader_candidates"]
    assert advice["measured_samples_s"] >= (1 + GAIN) * advice["current_samples_s"] == (1 + GAIN) * rates[(2, False)]
    assert verdict["fix"].startswith(f"use num_workers={advice['num_workers']}: measured")
    assert "raise num_workers" not in verdict["fix"] and "at most" not in verdict["fix"]


def test_decoded_and_blurred_photos_advise_more_workers_measured_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _, _results, m = smoke(
        tmp_path,
        monkeypatch,
        # Batches of 4: each candidate's first batches are made untimed (1 + 2 per worker, as the loader prefetches
        # them), ~20 ms of CPU per sample; 0.4 s per candidate, 0.6 s splitting a sample's time.
        config(steps=6, batch_size_cpu=4, loader_probe_s=3.0),
        dataset=f"{PLUGINS}:blurred_photos",
        model=f"{PLUGINS}:tiny_model",
        workers=0,
    )
    verdict = planted_row(m)
    assert planted_row(m)["id"] in ("data-bound", "cpu-starved"), verdict
    advice, _ = measured(m)
    assert advice["faster"] and advice["num_workers"] >= 1, m["loader_candidates"]
    assert advice["measured_samples_s"] >= (1 + GAIN) * advice["current_samples_s"]
    assert {c["num_workers"] for c in m["loader_candidates"]} >= {0, 1, 2, 4}  # 0, 1, cores-1, cores, 2 x cores
    # The cost is split by transform; stage-data is credited with the read + decode part only.
    parts = {p["name"]: p["share"] for p in m["data_cost"]["parts"]}
    assert m["data_cost"]["method"] == "compose" and parts["GaussianBlur"] > parts["read + decode"] > 0
    assert abs(sum(parts.values()) - 1) < 0.01
    saved = f"pre-decoding (invoke stage-data) saves at most ~{100 * parts['read + decode']:.0f}%"
    assert "GaussianBlur" in verdict["fix"] and saved in verdict["fix"]


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that burns ~10% of one core: 10 ms of spinning every 100 ms."""
    spin = "import time\nwhile True:\n    e = time.monotonic() + 0.01\n    while time.monotonic() < e: pass\n    time.sleep(0.09)"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    yield proc
    proc.kill()
    proc.wait()


def test_a_small_neighbour_does_not_take_the_blame_for_a_saturated_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neighbour: subprocess.Popen[bytes]
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # The least time per candidate: where a sample's time goes is not asserted here. (Batches stay at 16: with the
    # 4-sample batches of the test above the waits are too short for the sampler to see the cores saturated.)
    cfg = config(steps=30, loader_probe_s=1.0)
    _, _results, m = smoke(
        tmp_path, monkeypatch, cfg, dataset=f"{PLUGINS}:blurred_photos", model=f"{PLUGINS}:tiny_model", workers=4
    )
    assert neighbour.poll() is None  # it ran throughout
    verdicts = m["diagnosis"]["verdicts"]
    assert planted_row(m)["id"] == "cpu-starved", verdicts
    ev = planted_row(m)["evidence"]
    advice, _ = measured(m)
    fix = planted_row(m)["fix"]
    # Either the setting it names was measured faster, or none is named and the fix says its figure is an estimate.
    named = advice["faster"] and advice["measured_samples_s"] >= (1 + GAIN) * advice["current_samples_s"]
    estimated = not advice["faster"] and "no loader setting measured" in fix and "estimate" in fix
    assert named or estimated, (advice, fix)
    others = ev["machine_cpu_during_wait"] - ev["cpu_during_wait"]
    if others >= cfg.verify.contended_min_share:
        pytest.skip(
            f"other jobs on this box took {others:.0%} of the cores during the run besides the planted neighbour "
            f"(~5%): a real contention of {cfg.verify.contended_min_share:.0%} or more, not what this test plants"
        )
    assert "other processes take the CPU" not in planted_row(m)["summary"]
    assert "cpu-contended" not in [v["id"] for v in verdicts]
