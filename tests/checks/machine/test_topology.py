"""Rules of gpu-topology, gpu-p2p, gpu-allreduce, nccl-env and the NUMA advice, on the replayed multi-GPU fixtures
(topology read through the fake pynvml, recorded p2p and all-reduce figures) and variants of them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from checks.config import make_config
from checks.facts import AllreduceFacts, GpuPair, LocalAllreduceFacts, MachineFacts, P2PBandwidth, P2PFacts
from checks.machine.bootstrap import BootstrapRequest, bootstrap
from checks.machine.collective import gpu_allreduce, gpu_p2p
from checks.machine.nccl_env import nccl_env
from checks.machine.resources import dataloader_advice
from checks.machine.topology import gpu_topology, matrix
from checks.result import Status
from checks.snapshot import load_snapshot

MACHINES = Path(__file__).resolve().parents[2] / "fixtures" / "machines"
CFG = make_config()


def box(name: str) -> MachineFacts:
    return load_snapshot(MACHINES / name)[0]


def with_pairs(m: MachineFacts, change: dict[tuple[int, int], dict[str, Any]]) -> MachineFacts:
    assert m.topology is not None
    pairs = tuple(dataclasses.replace(p, **change.get((p.a, p.b), {})) for p in m.topology.pairs)
    return dataclasses.replace(m, topology=dataclasses.replace(m.topology, pairs=pairs))


def with_env(m: MachineFacts, **env: str) -> MachineFacts:
    return dataclasses.replace(m, host=dataclasses.replace(m.host, env=env))


# --- gpu-topology -------------------------------------------------------------------------------------------


def test_matrix_is_topo_m_shaped() -> None:
    topo = box("a100-pcie-8x-two-sockets.json").topology
    assert topo is not None
    lines = matrix(topo)
    assert lines[0].split() == [*(f"GPU{i}" for i in range(8)), "CPU", "Affinity", "NUMA"]
    assert lines[1].split() == ["GPU0", "X", "PXB", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS", "0-31", "0"]
    assert lines[8].split()[-2:] == ["32-63", "1"]


def test_sxm_pair_without_nvlink_fails_naming_the_pairs() -> None:
    m = box("h100-sxm-8x-nvlink.json")
    down = {(a, 5): {"nvlinks": 0, "level": 50 if a >= 4 else 40} for a in range(5)}
    r = gpu_topology(with_pairs(m, down), CFG)[0]
    assert r.status is Status.FAIL
    assert r.summary.startswith("5 pair(s) without NVLink: gpu0-gpu5 NODE, gpu1-gpu5 NODE")
    assert "nvidia-smi nvlink --status" in (r.hint or "")


def test_pcie_boards_without_bridges_are_not_expected_to_have_nvlink() -> None:
    r = gpu_topology(box("a100-pcie-8x-two-sockets.json"), CFG)[0]
    assert r.status is Status.WARN and "without NVLink" not in r.summary
    assert "GPUs split across sockets (NUMA 0: gpu0-3; NUMA 1: gpu4-7): 16 pair(s) SYS" in r.summary
    assert "CUDA_VISIBLE_DEVICES" in (r.hint or "")


def test_p2p_off_under_one_switch_warns_and_on_nvlink_fails() -> None:
    pcie = with_pairs(box("a100-pcie-8x-two-sockets.json"), {(0, 1): {"p2p_read": "DR", "p2p_write": "DR"}})
    r = gpu_topology(pcie, CFG)[0]
    assert (
        r.status is Status.WARN
        and "no P2P between gpu0-gpu1 under one PCIe switch (disabled by the driver" in r.summary
    )
    nvlink = with_pairs(box("h100-pcie-2x-bridge.json"), {(0, 1): {"p2p_read": "TNS", "p2p_write": "TNS"}})
    r = gpu_topology(nvlink, CFG)[0]
    assert r.status is Status.FAIL and "P2P TNS on NVLink pair gpu0-gpu1" in r.summary


def test_geforce_without_p2p_is_expected_and_with_p2p_is_a_patched_driver() -> None:
    m = box("rtx4090-4x-no-p2p.json")
    r = gpu_topology(m, CFG)[0]
    assert r.status is Status.OK and "GeForce: no P2P" in r.summary
    patched = with_pairs(m, {(0, 1): {"p2p_read": "OK", "p2p_write": "OK"}})
    r = gpu_topology(patched, CFG)[0]
    assert r.status is Status.WARN and "patched driver" in r.summary and "NCCL_P2P_DISABLE=1" in (r.hint or "")


def test_older_snapshot_and_single_gpu_skip() -> None:
    m = box("h100-sxm-8x-nvlink.json")
    assert gpu_topology(dataclasses.replace(m, topology=None), CFG)[0].status is Status.SKIP
    one = dataclasses.replace(m, nvml=dataclasses.replace(m.nvml, gpus=m.nvml.gpus[:1]))
    assert [r.status for r in (gpu_topology(one, CFG) + gpu_p2p(one, CFG) + gpu_allreduce(one, CFG))] == [
        Status.SKIP
    ] * 3


# --- gpu-p2p and gpu-allreduce -------------------------------------------------------------------------------


def _slow_pair(m: MachineFacts, src: int, dst: int, gb_s: float) -> MachineFacts:
    assert m.p2p is not None
    rows = tuple(dataclasses.replace(r, gb_s=gb_s) if (r.src, r.dst) == (src, dst) else r for r in m.p2p.pairs)
    return dataclasses.replace(m, p2p=dataclasses.replace(m.p2p, pairs=rows))


def _peak(m: MachineFacts, busbw: float, backend: str = "nccl") -> MachineFacts:
    rows = (AllreduceFacts(backend, 8, 1 << 30, busbw * 8 / 14, busbw, 0.01, 20),)
    return dataclasses.replace(m, allreduce_local=LocalAllreduceFacts(rows=rows))


def test_p2p_pair_far_below_its_nvlink_rate_fails_by_name() -> None:
    r = gpu_p2p(_slow_pair(box("h100-sxm-8x-nvlink.json"), 3, 6, 95.0), CFG)[0]
    assert r.status is Status.FAIL
    assert "lowest gpu3->gpu6 95 GB/s over NV18, 21% of its 450 GB/s line rate" in r.summary
    assert r.value == {"median_gb_s": 391.8, "slowest": "gpu3->gpu6", "slowest_gb_s": 95.0}


def test_p2p_rate_through_host_memory_is_half_the_link() -> None:
    r = gpu_p2p(box("rtx4090-4x-no-p2p.json"), CFG)[0]
    assert r.status is Status.OK and "through host memory, 80% of its 16 GB/s line rate" in r.summary


def test_p2p_pair_that_failed_to_copy_fails() -> None:
    m = box("h100-pcie-2x-bridge.json")
    rows = (P2PBandwidth(0, 1, error="RuntimeError: CUDA error: an illegal memory access"), P2PBandwidth(1, 0, 240.0))
    r = gpu_p2p(dataclasses.replace(m, p2p=P2PFacts(pairs=rows)), CFG)[0]
    assert r.status is Status.FAIL and r.summary.startswith("gpu0->gpu1: RuntimeError: CUDA error")


def test_slow_allreduce_fails_naming_the_slow_pair_from_the_matrix() -> None:
    m = _peak(_slow_pair(box("h100-sxm-8x-nvlink.json"), 2, 7, 120.0), 150.0)
    r = gpu_allreduce(m, CFG)[0]
    assert r.status is Status.FAIL and "41% of ~370 GB/s expected for H100 SXM5 over NVLink" in r.summary
    assert "slowest pair gpu2->gpu7 120 GB/s over NV18" in (r.hint or "")
    assert gpu_allreduce(_peak(m, 250.0), CFG)[0].status is Status.WARN  # 68% of 370


def test_allreduce_expectation_by_path() -> None:
    a100 = gpu_allreduce(box("a100-pcie-8x-two-sockets.json"), CFG)[0]
    assert a100.status is Status.FAIL and "Gen4 host memory" in a100.summary and "gpu0->gpu4" in (a100.hint or "")
    unknown = box("h100-pcie-2x-bridge.json")
    renamed = tuple(dataclasses.replace(g, name="NVIDIA Future PCIe") for g in unknown.nvml.gpus)
    r = gpu_allreduce(dataclasses.replace(unknown, nvml=dataclasses.replace(unknown.nvml, gpus=renamed)), CFG)[0]
    assert r.status is Status.OK and "no expected figure for NVIDIA Future PCIe over an NVLink bridge" in r.summary


def test_gloo_is_reported_not_judged_and_a_failed_run_fails() -> None:
    m = box("h100-sxm-8x-nvlink.json")
    assert "not NCCL, not judged" in gpu_allreduce(_peak(m, 1.0, "gloo"), CFG)[0].summary
    failed = dataclasses.replace(m, allreduce_local=LocalAllreduceFacts(error="all-reduce exited with 1: NCCL error"))
    r = gpu_allreduce(failed, CFG)[0]
    assert r.status is Status.FAIL and "NCCL error" in r.summary and "NCCL_DEBUG=INFO" in (r.hint or "")


# --- nccl-env -----------------------------------------------------------------------------------------------


def test_inherited_p2p_disable_warns_with_what_it_does() -> None:
    r = nccl_env(with_env(box("h100-sxm-8x-nvlink.json"), NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO"), CFG)[0]
    assert r.status is Status.WARN and r.value == ["NCCL_P2P_DISABLE"]
    assert "this box's GPUs have P2P" in r.summary and "`unset NCCL_P2P_DISABLE`" in (r.hint or "")


def test_debug_level_alone_is_harmless() -> None:
    r = nccl_env(with_env(box("h100-sxm-8x-nvlink.json"), NCCL_DEBUG="WARN"), CFG)[0]
    assert r.status is Status.OK and r.summary == "NCCL variables: set and harmless here: NCCL_DEBUG"


def test_socket_interface_loopback_or_missing() -> None:
    m = box("h100-sxm-8x-nvlink.json")
    assert "loopback" in nccl_env(with_env(m, NCCL_SOCKET_IFNAME="lo"), CFG)[0].summary
    r = nccl_env(with_env(m, NCCL_SOCKET_IFNAME="=ens9"), CFG)[0]
    assert r.status is Status.FAIL and "it has eno1, ib0, lo" in r.summary  # no NCCL job starts, one box too
    assert "on this box alone too" in r.summary and "between hosts" not in r.summary
    assert nccl_env(with_env(m, NCCL_SOCKET_IFNAME="ib"), CFG)[0].status is Status.OK  # a prefix of ib0


def test_algo_proto_and_hidden_gpus() -> None:
    m = box("h100-sxm-8x-nvlink.json")
    m = dataclasses.replace(m, torch=dataclasses.replace(m.torch, device_count=2))
    r = nccl_env(with_env(m, NCCL_ALGO="Tree", NCCL_PROTO="^LL128", CUDA_VISIBLE_DEVICES="0,1"), CFG)[0]
    assert r.value == ["CUDA_VISIBLE_DEVICES", "NCCL_ALGO", "NCCL_PROTO"]
    assert "hides 6 of 8 GPUs" in r.summary and "pins the algorithm to Tree" in r.summary


# --- NUMA in the DataLoader advice, and the report's measurements -------------------------------------------


def test_dataloader_advice_names_each_gpus_cpus_on_two_nodes_only() -> None:
    two = dataloader_advice(box("a100-pcie-8x-two-sockets.json"), CFG)[0].summary
    assert "NUMA: gpu0-3 -> CPUs 0-31 (NUMA 0); gpu4-7 -> CPUs 32-63 (NUMA 1)" in two and "numactl" in two
    assert "NUMA" not in dataloader_advice(box("rtx4090-4x-no-p2p.json"), CFG)[0].summary


def test_report_json_carries_topology_p2p_and_local_allreduce() -> None:
    request = BootstrapRequest(config=CFG, machine=MACHINES / "a100-pcie-8x-two-sockets.json", dry_run=True)
    measured = bootstrap(request).report.to_json()["measurements"]
    assert measured["topology"]["pairs"][0] == {
        "a": 0,
        "b": 1,
        "path": "PXB",
        "p2p_read": "OK",
        "p2p_write": "OK",
        "p2p_atomics": "OK",
    }
    assert measured["topology"]["gpus"][4] == {"index": 4, "numa_node": 1, "cpus": "32-63"}
    cross = next(p for p in measured["p2p"]["pairs"] if (p["src"], p["dst"]) == (0, 4))
    assert cross["path"] == "SYS, through host memory" and cross["line_rate_gb_s"] == 15.75
    assert measured["allreduce_local"]["expected_busbw_gb_s"] == 10 and len(measured["allreduce_local"]["rows"]) == 6


def test_pair_record_defaults_mean_unknown() -> None:
    assert GpuPair(0, 1).p2p_read is None


def test_a_replayed_snapshot_without_a_recorded_allreduce_skips_it_with_the_reason(tmp_path: Path) -> None:
    """Snapshots recorded before the all-reduce section (or without measurements): skip, as gpu-p2p does."""
    doc = json.loads((MACHINES / "h100-sxm-8x-nvlink.json").read_text())
    del doc["machine"]["allreduce_local"]
    path = tmp_path / "h100-sxm-8x-no-allreduce.json"
    path.write_text(json.dumps(doc))
    results = {r.id: r for r in bootstrap(BootstrapRequest(config=CFG, machine=path, dry_run=True)).report.results}
    r = results["gpu-allreduce"]
    assert r.status is Status.SKIP and r.summary.startswith("not measured"), r
    assert "None" not in r.summary and results["gpu-p2p"].status is Status.OK  # the recorded matrix is still judged


def test_a_failed_local_allreduce_points_at_a_socket_interface_the_box_lacks() -> None:
    from checks.facts import LocalAllreduceFacts
    from checks.machine.collective import gpu_allreduce

    m = box("h100-sxm-8x-nvlink.json")
    failed = dataclasses.replace(
        m, allreduce_local=LocalAllreduceFacts(error="all-reduce exited with 1: DistBackendError")
    )
    plain = gpu_allreduce(failed, CFG)[0]
    assert plain.status is Status.FAIL and "NCCL_SOCKET_IFNAME" not in (plain.hint or "")
    named = gpu_allreduce(with_env(failed, NCCL_SOCKET_IFNAME="ens9"), CFG)[0]
    assert (named.hint or "").startswith("NCCL_SOCKET_IFNAME=ens9: names no interface of this host")
    assert "unset NCCL_SOCKET_IFNAME" in (named.hint or "")


def test_the_numa_advice_names_only_cpus_this_process_may_use() -> None:
    from checks.machine.topology import cpuset_outside_gpus, numa_reason

    whole = box("h100-sxm-8x-nvlink.json")  # an older snapshot: no CPU list recorded, nothing is flagged
    assert whole.host.cpu_allowed == () and cpuset_outside_gpus(whole) is None
    assert "gpu4-7 -> CPUs 48-95,144-191 (NUMA 1)" in (numa_reason(whole) or "")
    node0 = box("h100-sxm-8x-cpuset-node0.json")
    text = numa_reason(node0) or ""
    assert "48-95" not in text and "gpu4-7 (NUMA 1) have no local CPU this container may use" in text
    flagged = cpuset_outside_gpus(node0)
    assert flagged is not None and flagged.status is Status.WARN and "none of them local to gpu4-7" in flagged.summary
    assert "CUDA_VISIBLE_DEVICES" in (flagged.hint or "") and "gpu0-3" in (flagged.hint or "")
