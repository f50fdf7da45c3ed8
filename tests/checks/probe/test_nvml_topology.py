"""NVML topology through the fake pynvml (real exception classes and signatures): the four boxes of
tests/checks/topology_machines.py read into exactly the topology sections of their snapshot fixtures."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from checks.probe.nvml import read_topology
from checks.snapshot import load_snapshot
from tests.checks.topology_machines import CPU_COUNT, MACHINES, h100_pcie_2x_bridge, h100_sxm_8x, rtx4090_4x
from tests.fakes.nvml import FakeNvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machines"


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_fixture_topology_is_what_the_adapter_reads(name: str) -> None:
    facts, _ = load_snapshot(FIXTURES / name)
    read = read_topology(FakeNvml(MACHINES[name]()), CPU_COUNT[name])
    assert facts.topology is not None
    assert read.pairs == facts.topology.pairs and read.gpus == facts.topology.gpus


def test_hgx_pairs_are_nv18_through_the_switches_and_numa_split() -> None:
    topo = read_topology(FakeNvml(h100_sxm_8x()), 192)
    assert len(topo.pairs) == 28 and {p.nvlinks for p in topo.pairs} == {18}
    assert {g.numa_node for g in topo.gpus[:4]} == {0} and {g.numa_node for g in topo.gpus[4:]} == {1}
    assert topo.gpus[4].cpus == (*range(48, 96), *range(144, 192))
    assert topo.gpus[0].nvlink_switch_links == 18 and topo.gpus[0].nvlink_peers == ()


def test_bridge_links_are_counted_by_their_far_end() -> None:
    topo = read_topology(FakeNvml(h100_pcie_2x_bridge()), 32)
    assert topo.gpus[0].nvlink_peers == (topo.gpus[1].bus_id,) * 12
    assert topo.pairs[0].nvlinks == 12 and topo.pairs[0].level == 30


def test_geforce_has_no_nvlink_and_gns_is_read_for_every_pair() -> None:
    topo = read_topology(FakeNvml(rtx4090_4x()), 64)
    assert all(g.nvlink_peers == () and g.nvlink_switch_links == 0 for g in topo.gpus)
    assert {(p.p2p_read, p.p2p_write, p.p2p_nvlink) for p in topo.pairs} == {("GNS", "GNS", "NS")}


def test_p2p_index_is_an_int_not_pynvmls_read_tuple() -> None:
    """nvidia-ml-py 13.615.71 spells NVML_P2P_CAPS_INDEX_READ as (0,): passed on, ctypes refuses it."""
    assert pynvml.NVML_P2P_CAPS_INDEX_READ == (0,)
    seen: list[int] = []

    def status(other: int, index: int) -> int:
        seen.append(index)
        return pynvml.NVML_P2P_STATUS_OK

    gpus = rtx4090_4x()[:2]
    gpus[0]["GetP2PStatus"] = status
    topo = read_topology(FakeNvml(gpus), 64)
    assert sorted(seen) == [0, 1, 2, 3] and all(type(i) is int for i in seen)
    assert topo.pairs[0].p2p_read == "OK"


def test_numa_falls_back_to_the_gpus_own_node_and_none_when_unanswered() -> None:
    gpus = rtx4090_4x()[:2]
    gpus[0]["GetMemoryAffinity"] = pynvml.NVMLError_NotSupported
    gpus[0]["GetNumaNodeId"] = 3
    gpus[1]["GetMemoryAffinity"] = pynvml.NVMLError_NotSupported
    topo = read_topology(FakeNvml(gpus), 64)
    assert [g.numa_node for g in topo.gpus] == [3, None]


def test_a_gpu_lost_mid_read_costs_its_cells_not_the_read() -> None:
    gpus = h100_sxm_8x()[:3]
    gpus[1]["GetTopologyCommonAncestor"] = pynvml.NVMLError_GpuIsLost
    topo = read_topology(FakeNvml(gpus), 192)
    lost = [p for p in topo.pairs if p.a == 1]
    assert [(p.b, p.level, p.p2p_read) for p in lost] == [(2, None, None)]
    assert next(p for p in topo.pairs if (p.a, p.b) == (0, 2)).level == 40


def test_without_nvml_the_topology_says_why() -> None:
    topo = read_topology(FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded()))
    assert topo.error is not None and "Driver Not Loaded" in topo.error and topo.pairs == ()
