from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from checks import probe as probe_mod
from checks.facts import AllocFacts, BenchFacts, GpuBench
from checks.probe import LocalProbe, SnapshotProbe
from checks.snapshot import dump_snapshot
from tests.factories import config, gpu, machine


@pytest.fixture(autouse=True)
def _no_disk_or_download_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the GPU benchmarks; disks and downloads are tested in test_disk*.py / test_net*.py."""
    monkeypatch.setattr(probe_mod, "_disks_and_net", lambda facts, cfg, clock: facts)


def _snapshot(tmp_path: Path, **rest: Any) -> Path:
    path = tmp_path / "box.json"
    path.write_text(json.dumps(dump_snapshot(machine(**rest), recorded=True)))
    return path


def test_snapshot_replay_skips_live_measurements(tmp_path: Path) -> None:
    probe = SnapshotProbe(_snapshot(tmp_path))
    facts = probe.measure(probe.machine(), config())
    assert probe.live is False and probe.label == "snapshot box.json (recorded)"
    assert facts.bench is not None and "need the live machine" in (facts.bench.skipped or "")
    alloc = probe.alloc("expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",), config())
    assert alloc.skipped and "live machine" in alloc.skipped


def test_snapshot_replays_recorded_measurements(tmp_path: Path) -> None:
    recorded_alloc = AllocFacts(wanted="x:1", variable="PYTORCH_CUDA_ALLOC_CONF", env_seen="x:1")
    probe = SnapshotProbe(
        _snapshot(tmp_path, bench=BenchFacts(gpus=(GpuBench(index=0, h2d_gb_s=50.0),)), alloc=recorded_alloc)
    )
    facts = probe.measure(probe.machine(), config())
    assert facts.bench is not None and facts.bench.recorded and facts.bench.gpus[0].h2d_gb_s == 50.0
    assert probe.alloc("y", ("PYTORCH_CUDA_ALLOC_CONF",), config()) == recorded_alloc


@pytest.mark.parametrize(
    ("facts", "cfg", "reason"),
    [
        (machine(), config(bench={"enabled": False}), "disabled"),
        (machine(nvml={"error": "no NVML", "gpus": ()}), config(), "no NVIDIA GPU"),
        (machine(torch={"cuda_available": False}), config(), "torch cannot use CUDA"),
    ],
)
def test_live_benchmarks_skip_with_a_reason(facts: Any, cfg: Any, reason: str) -> None:
    measured = LocalProbe().measure(facts, cfg)
    assert measured.bench is not None and reason in (measured.bench.skipped or "")


class _IdleSampler:
    """Stands in for PcieLinkSampler: no NVML, links never seen."""

    def __enter__(self) -> _IdleSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def sample(self) -> None:
        pass

    def peak(self) -> dict[int, tuple[int | None, int | None]]:
        return {}


def test_live_benchmarks_record_the_link_seen_under_load(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Sampler(_IdleSampler):
        def sample(self) -> None:
            seen["sampled"] = seen.get("sampled", 0) + 1

        def peak(self) -> dict[int, tuple[int | None, int | None]]:
            return {0: (4, 8)}

    def fake_bench(settings: dict[str, Any], timeout: float, while_running: Any = None) -> BenchFacts:
        seen["settings"] = settings
        while_running()
        return BenchFacts(gpus=(GpuBench(index=0, h2d_gb_s=12.0),))

    monkeypatch.setattr(probe_mod, "PcieLinkSampler", Sampler)
    monkeypatch.setattr(probe_mod, "run_bench", fake_bench)
    facts = LocalProbe().measure(machine(gpus=(gpu(0), gpu(1))), config())
    assert seen["sampled"] == 1 and seen["settings"]["matmul_n"] == 8192
    assert (facts.nvml.gpus[0].pcie_gen_loaded, facts.nvml.gpus[0].pcie_width_loaded) == (4, 8)
    assert facts.nvml.gpus[1].pcie_gen_loaded is None
    assert facts.bench == BenchFacts(gpus=(GpuBench(index=0, h2d_gb_s=12.0),))
    assert dataclasses.replace(facts.nvml.gpus[1]) == gpu(1)


def test_no_bench_also_skips_recorded_benchmarks_on_replay(tmp_path: Path) -> None:
    probe = SnapshotProbe(_snapshot(tmp_path, bench=BenchFacts(gpus=(GpuBench(index=0, h2d_gb_s=50.0),))))
    facts = probe.measure(probe.machine(), config(bench={"enabled": False}))
    assert facts.bench == BenchFacts(skipped="disabled (preflight.bench.enabled: false, or --no-bench)")


def test_benchmark_rows_are_joined_to_nvml_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_bench(settings: dict[str, Any], timeout: float, while_running: Any = None) -> BenchFacts:
        # CUDA ordered the GPUs fastest-first: its device 0 is NVML's GPU 1
        return BenchFacts(
            gpus=(GpuBench(index=0, uuid="abc-1", h2d_gb_s=1.0), GpuBench(index=1, uuid="abc-0", h2d_gb_s=2.0))
        )

    monkeypatch.setattr(probe_mod, "PcieLinkSampler", _IdleSampler)
    monkeypatch.setattr(probe_mod, "run_bench", fake_bench)
    gpus = (dataclasses.replace(gpu(0), uuid="GPU-abc-0"), dataclasses.replace(gpu(1), uuid="GPU-ABC-1"))
    facts = LocalProbe().measure(machine(gpus=gpus), config())
    assert facts.bench is not None
    assert {row.index: row.h2d_gb_s for row in facts.bench.gpus} == {1: 1.0, 0: 2.0}
