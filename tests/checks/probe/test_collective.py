"""The p2p and local all-reduce children: real processes. The local all-reduce runs for real with 2 gloo
processes under torchrun (the path NCCL takes on a GPU box, backend aside); the CUDA outputs are parsed from
recorded JSON."""

from __future__ import annotations

from collections.abc import Callable

import psutil
import pytest

from checks.facts import P2PBandwidth
from checks.probe.collective import allreduce_facts, p2p_facts, run_local_allreduce, run_p2p

# p2p_bench.py's line on a 2-GPU box whose CUDA order (FASTEST_FIRST) is the reverse of NVML's bus order.
RECORDED_P2P = {
    "pairs": [
        {"src": 0, "dst": 1, "peer_access": True, "gb_s": 246.3},
        {"src": 1, "dst": 0, "peer_access": True, "gb_s": 31.2},
    ],
    "uuids": ["GPU-bbbb", "GPU-aaaa"],
    "mib": 256,
}


@pytest.fixture
def children_left() -> Callable[[], list[str]]:
    """The processes under this one that were not there when the test began (a worker may hold a fixture's)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def left() -> list[str]:
        return [f"{p.pid} {p.name()}" for p in psutil.Process().children(recursive=True) if p.pid not in before]

    return left


@pytest.mark.slow
def test_local_allreduce_with_two_gloo_processes(children_left: Callable[[], list[str]]) -> None:
    facts = run_local_allreduce(2, "gloo", max_mib=4, budget_s=5.0, timeout_s=60.0)
    assert facts.error is None, facts.error
    assert [r.bytes for r in facts.rows] == [1 << 20, 4 << 20]
    for row in facts.rows:
        assert (row.backend, row.world_size, row.iterations >= 2) == ("gloo", 2, True)
        assert row.busbw_gb_s == row.algbw_gb_s > 0  # 2(n-1)/n is 1 for two processes
        assert row.seconds and row.algbw_gb_s == pytest.approx(row.bytes / row.seconds / 1e9, rel=0.01)
    assert children_left() == []


@pytest.mark.slow
def test_nccl_without_a_gpu_is_a_failed_run_with_the_ranks_last_words(children_left: Callable[[], list[str]]) -> None:
    facts = run_local_allreduce(2, "nccl", max_mib=1, budget_s=1.0, timeout_s=60.0)
    assert facts.rows == () and facts.error is not None and facts.error.startswith("all-reduce exited with")
    assert children_left() == []


@pytest.mark.slow
def test_p2p_timing_loop_runs_on_cpu() -> None:
    facts = run_p2p({"device": "cpu", "mib": 4, "warmup": 1, "repeats": 3}, timeout=60.0)
    assert facts.skipped is None and facts.mib == 4
    assert [(r.src, r.dst) for r in facts.pairs] == [(0, 1), (1, 0)]
    assert all(r.gb_s and r.gb_s > 0 and r.peer_access is None for r in facts.pairs)


def test_recorded_p2p_is_renumbered_to_nvml_by_uuid() -> None:
    facts = p2p_facts(RECORDED_P2P, nvml_uuids=["GPU-aaaa", "GPU-BBBB"])
    assert facts.pairs == (P2PBandwidth(1, 0, 246.3, True), P2PBandwidth(0, 1, 31.2, True))
    assert p2p_facts(RECORDED_P2P).pairs[0].src == 0  # no NVML UUIDs: CUDA's numbering stays


def test_skipped_and_failed_outputs() -> None:
    assert p2p_facts({"skipped": "1 GPU visible to torch: no pair to measure"}).skipped is not None
    assert allreduce_facts({"error": "NCCL WARN"}).error == "NCCL WARN"
    assert allreduce_facts({"rows": []}).error == "the all-reduce printed no rows"
