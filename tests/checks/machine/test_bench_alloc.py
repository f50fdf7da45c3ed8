from __future__ import annotations

from typing import Any

from checks.facts import AllocFacts, BenchFacts, GpuBench
from checks.machine import alloc, bench
from checks.result import Status
from tests.factories import config, gpu, machine

GOOD: dict[str, Any] = {
    "h2d_gb_s": 55.0,
    "d2h_gb_s": 55.0,
    "d2d_gb_s": 2800.0,
    "matmul_tflops": 700.0,
    "matmul_dtype": "bfloat16",
}


def _by(results, check_id):
    return {r.subject: r for r in results if r.id == check_id}


def test_figures_are_judged_against_the_datasheet() -> None:
    slow = dict(GOOD, matmul_tflops=250.0)  # 25% of 989
    m = machine(bench=BenchFacts(gpus=(GpuBench(index=0, **slow),)))
    results = bench.gpu_bench(m, config())
    assert _by(results, "gpu-h2d")["gpu0"].status is Status.OK  # 55 of 63 GB/s
    mm = _by(results, "gpu-matmul")["gpu0"]
    assert mm.status is Status.FAIL and "25% of the 989 TFLOPS" in mm.summary


def test_an_outlier_among_identical_gpus_is_flagged() -> None:
    rows = tuple(GpuBench(index=i, **dict(GOOD, d2d_gb_s=2000.0 if i == 3 else 2800.0)) for i in range(4))
    m = machine(gpus=tuple(gpu(i) for i in range(4)), bench=BenchFacts(gpus=rows))
    d2d = _by(bench.gpu_bench(m, config()), "gpu-d2d")
    assert d2d["gpu3"].status is Status.WARN and "outlier" in d2d["gpu3"].summary
    assert all(d2d[f"gpu{i}"].status is Status.OK for i in range(3))


def test_fp32_matmul_is_never_judged_against_a_bf16_peak() -> None:
    m = machine(bench=BenchFacts(gpus=(GpuBench(index=0, **dict(GOOD, matmul_dtype="float32", matmul_tflops=50.0)),)))
    mm = _by(bench.gpu_bench(m, config()), "gpu-matmul")["gpu0"]
    assert mm.status is Status.OK and mm.expected is None


def test_a_failed_gpu_benchmark_is_a_failure_of_that_gpu() -> None:
    m = machine(bench=BenchFacts(gpus=(GpuBench(index=0, error="RuntimeError: CUDA error: unknown error"),)))
    assert _by(bench.gpu_bench(m, config()), "gpu-h2d")["gpu0"].status is Status.FAIL


def test_skipped_benchmarks_skip_every_metric_with_the_reason() -> None:
    results = bench.gpu_bench(machine(bench=BenchFacts(skipped="disabled")), config())
    assert [(r.id, r.status, r.summary) for r in results] == [
        (i, Status.SKIP, "disabled") for i in ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")
    ]


def _alloc(**kw) -> Status:
    base = {"wanted": "expandable_segments:True", "variable": "PYTORCH_CUDA_ALLOC_CONF"}
    [r] = alloc.alloc_conf(machine(alloc=AllocFacts(**{**base, **kw})), config())
    return r.status


def test_alloc_conf_verdicts() -> None:
    live = {"env_seen": "expandable_segments:True", "source": "accelerator-api"}
    assert _alloc(**live, torch_settings="expandable_segments:True") is Status.OK
    assert _alloc(**live, torch_settings=None) is Status.WARN
    assert _alloc(**live, torch_settings="expandable_segments:False") is Status.FAIL
    assert _alloc(env_seen=None) is Status.FAIL
    assert _alloc(error="ValueError: Expected 'True' or 'False'") is Status.FAIL
    assert _alloc(skipped="dry run") is Status.SKIP


def test_cuda_snapshot_reports_split_size_in_bytes() -> None:
    status = _alloc(
        wanted="max_split_size_mb:64",
        env_seen="max_split_size_mb:64",
        torch_settings="expandable_segments:False,max_split_size:67108864",
        source="cuda-snapshot",
    )
    assert status is Status.OK


def test_no_alloc_facts_means_replay() -> None:
    [r] = alloc.alloc_conf(machine(), config())
    assert r.status is Status.SKIP


def test_alloc_conf_when_applying_is_switched_off() -> None:
    assert _alloc(applied=False, env_seen=None) is Status.WARN
    users_own = {
        "env_seen": "max_split_size_mb:128",
        "torch_settings": "max_split_size_mb:128",
        "source": "accelerator-api",
    }
    assert _alloc(applied=False, **users_own) is Status.OK
