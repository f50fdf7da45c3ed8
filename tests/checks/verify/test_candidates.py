"""The DataLoader alone at candidate settings, and a sample's time split by transform, in this process (torch)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from checks.verify.smoke.candidates import data_cost, loader_alone, worker_counts
from checks.verify.smoke.loop import Feed
from tests.checks.verify.smoke_plugins import Compose, Patterned


def test_worker_counts_are_deduplicated_with_the_current_first() -> None:
    assert worker_counts(8, 2.0) == [8, 0, 1, 2, 4]
    assert worker_counts(0, 1.0) == [0, 1, 2]  # cores-1 = 0 and cores = 1 fold in
    assert worker_counts(3, 16.0) == [3, 0, 1, 15, 16, 32]


class Spin:
    def __init__(self, ms: float) -> None:
        self.s = ms / 1e3

    def __call__(self, x: Any) -> Any:
        end = time.perf_counter() + self.s
        while time.perf_counter() < end:
            pass
        return x


class Blur(Spin):
    pass


class Jitter(Spin):
    pass


class Folder(Patterned):
    def __init__(self, transform: Any) -> None:
        super().__init__(64)
        self.transform = transform

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        Spin(1.0)(None)  # the read (a wall-clock spin like the transforms, so a busy box stretches all alike)
        img, label = self.image(int(i))
        return self.transform(img), label


def test_a_compose_pipeline_is_timed_step_by_step_and_put_back() -> None:
    steps = [Jitter(2.0), Blur(6.0)]
    originals = list(steps)
    pipeline = Compose(steps)
    cost = data_cost(Folder(pipeline), 0.3)
    parts = {p["name"]: p["share"] for p in cost["parts"]}
    assert cost["method"] == "compose" and next(iter(parts)) == "Blur"  # largest first
    assert parts["Blur"] > parts["Jitter"] > 0.1 and parts["read + decode"] > 0.05
    assert abs(sum(parts.values()) - 1) < 0.01
    assert pipeline.transforms is steps and steps == originals  # the originals put back, in the same list


def test_a_single_transform_or_none_is_timed_whole() -> None:
    single = Folder(Blur(4.0))
    cost = data_cost(single, 0.2)
    assert cost["method"] == "transform" and [p["name"] for p in cost["parts"]] == ["Blur", "read + decode"]
    assert isinstance(single.transform, Blur)
    plain = data_cost(Patterned(64), 0.1)
    assert plain["method"] == "getitem" and plain["parts"][0]["name"] == "__getitem__"


@pytest.mark.slow
def test_every_candidate_is_timed_and_the_current_one_is_reported() -> None:
    dataset = Patterned(4096)

    def make(ds: Any, loader: dict[str, Any]) -> Feed:
        return Feed(ds, 32, 0, loader)

    loader = {"num_workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2}
    out = loader_alone(make, dataset, dataset, loader, 1.0, 1.0, False)
    rows = {r["num_workers"]: r for r in out["candidates"]}
    assert set(rows) == {0, 1, 2} and all(r["samples_s"] for r in rows.values())
    assert out["samples_s"] == rows[1]["samples_s"] and out["in_process_samples_s"] == rows[0]["samples_s"]
    assert sum(len(r["runs"]) for r in rows.values()) in (3, 5)  # the fastest and the current again, if they differ
    assert not any(r["pin_memory"] for r in rows.values())  # no GPU: pin_memory is not tried
