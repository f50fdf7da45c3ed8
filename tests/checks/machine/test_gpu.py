from __future__ import annotations

import pytest

from checks.facts import GpuProcess
from checks.machine import gpu as g
from checks.result import Status
from checks.tables import datasheet
from tests.factories import GIB, config, gpu, machine


def _status(check, **changes):
    [r] = check(machine(gpus=(gpu(**changes),)), config())
    return r.status


def test_power_cap_threshold_comes_from_config() -> None:
    assert _status(g.gpu_power, power_enforced_limit_mw=600_000) is Status.WARN  # 86% < 90%
    [r] = g.gpu_power(machine(gpus=(gpu(power_enforced_limit_mw=600_000),)), config(gpu={"power_min_fraction": 0.8}))
    assert r.status is Status.OK


def test_power_unreadable_skips() -> None:
    assert _status(g.gpu_power, power_enforced_limit_mw=None, power_limit_mw=None) is Status.SKIP


def test_pcie_idle_downtraining_is_not_judged_but_a_narrow_slot_is() -> None:
    assert _status(g.gpu_pcie, pcie_gen_current=1, pcie_width_current=16) is Status.OK
    assert _status(g.gpu_pcie, pcie_width_max=8) is Status.WARN  # x8 slot: 50%
    assert _status(g.gpu_pcie, pcie_gen_max=4, pcie_width_max=8) is Status.FAIL  # 25%


def test_pcie_under_load_wins_over_slot_capability() -> None:
    assert _status(g.gpu_pcie, pcie_gen_loaded=5, pcie_width_loaded=16) is Status.OK
    assert _status(g.gpu_pcie, pcie_gen_loaded=4, pcie_width_loaded=16) is Status.WARN


def test_nvlink_sxm_missing_links_fail_and_pcie_parts_have_none() -> None:
    assert _nvlink(nvlink_active=12).status is Status.FAIL
    [r] = g.gpu_nvlink(machine(gpus=(gpu(name="NVIDIA H100 PCIe", nvlink_total=None, nvlink_active=None),)), config())
    assert r.status is Status.OK and "no NVLink" in r.summary
    [r] = g.gpu_nvlink(machine(gpus=(gpu(name="NVIDIA H100 PCIe", nvlink_total=12, nvlink_active=6),)), config())
    assert r.status is Status.WARN


def _nvlink(nvswitches: int = 0, gpus: int = 2, **changes):
    """gpu0's verdict on a box of ``gpus`` alike GPUs (links matter between two or more)."""
    box = tuple(gpu(index=i, **changes) for i in range(gpus))
    r, *_ = g.gpu_nvlink(machine(gpus=box, host={"nvswitch_count": nvswitches}), config())
    return r


def test_a_one_gpu_slice_of_an_sxm_host_with_links_down_is_fine() -> None:
    """Recorded on a rented one-GPU H200 VM (tests/fixtures/machines/recorded-h200-sxm-1x.json): 0 of 18 links
    up. With no second GPU in the machine nothing crosses NVLink; the same links down on a 2-GPU box fail."""
    alone = _nvlink(gpus=1, name="NVIDIA H200", nvlink_total=18, nvlink_active=0)
    assert alone.status is Status.OK and "the only GPU in this machine" in alone.summary, alone.summary
    assert alone.summary.startswith("0 of 18 NVLink links active, SXM part")
    assert _nvlink(gpus=2, name="NVIDIA H200", nvlink_total=18, nvlink_active=0).status is Status.FAIL


@pytest.mark.parametrize(
    ("changes", "nvswitches", "evidence"),
    [
        ({"name": "NVIDIA X100-SXM6-96GB", "power_default_limit_mw": 300_000}, 0, "'SXM6' in the name"),
        ({"name": "NVIDIA X100 96GB HBM3e", "power_default_limit_mw": 300_000}, 0, "'HBM3e' in the name"),
        ({"name": "NVIDIA X200", "power_default_limit_mw": 300_000}, 8, "8 NVSwitch device(s)"),
        ({"name": "NVIDIA X200"}, 0, "default power limit 700 W"),
        ({"name": "NVIDIA H800 80GB HBM3"}, 0, "datasheet table: H800 SXM5"),
    ],
)
def test_sxm_part_outside_the_table_with_links_down_fails(changes: dict, nvswitches: int, evidence: str) -> None:
    """An SXM module has no bridge; its links down are a fault, whatever the table knows."""
    r = _nvlink(nvswitches, nvlink_total=18, nvlink_active=4, **changes)
    assert r.status is Status.FAIL and evidence in r.summary, r.summary
    assert "seating" not in (r.hint or "")


def test_pcie_board_links_all_inactive_is_no_bridge_and_a_partial_bridge_warns() -> None:
    """Data-center PCIe cards report links that exist; 0 active of N is no bridge fitted."""
    for name in ("NVIDIA A800 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA X100 PCIe", "NVIDIA H100 NVL"):
        r = _nvlink(name=name, nvlink_total=12, nvlink_active=0)
        assert r.status is Status.OK and "no NVLink bridge fitted" in r.summary, (name, r.summary)
        r = _nvlink(name=name, nvlink_total=12, nvlink_active=4)
        assert r.status is Status.WARN and "partly active" in r.summary, (name, r.summary)
    r = _nvlink(name="NVIDIA RTX A5000", nvlink_total=4, nvlink_active=4)
    assert r.status is Status.OK and "bridge" in r.summary


def test_a_bridged_board_is_whole_at_its_bridges_links_not_at_nvmls_slot_count() -> None:
    """NVML lists 18 link slots on an H100 NVL; a fitted bridge makes 12 of them active."""
    r = _nvlink(name="NVIDIA H100 NVL", nvlink_total=18, nvlink_active=12)
    assert r.status is Status.OK and "partly" not in r.summary, r.summary
    assert r.summary == "12 of the 12 links an NVLink bridge gives a H100 NVL active (18 slots listed)"
    r = _nvlink(name="NVIDIA H100 NVL", nvlink_total=18, nvlink_active=6)
    assert r.status is Status.WARN and "6 of the 12 links" in r.summary and "partly active bridge" in r.summary
    r = _nvlink(name="NVIDIA H200 NVL", nvlink_total=18, nvlink_active=18)  # its bridge uses every slot
    assert r.status is Status.OK and r.summary == "18 of 18 NVLink links active (bridge)"


def test_sxm_part_with_no_links_reported_is_not_called_fine() -> None:
    r = _nvlink(name="NVIDIA X100-SXM6-96GB", nvlink_total=None, nvlink_active=None)
    assert r.status is Status.WARN and "SXM part" in r.summary


@pytest.mark.parametrize(
    ("name", "model", "sxm_links"),
    [
        ("NVIDIA A800-SXM4-80GB", "A800 80GB SXM4", 8),
        ("NVIDIA A800 80GB PCIe", "A800 80GB PCIe", 0),
        ("NVIDIA H800 80GB HBM3", "H800 SXM5", 8),
        ("NVIDIA H800 PCIe", "H800 PCIe", 0),
        ("Tesla V100-SXM2-16GB", "V100 SXM2 16GB", 6),
        ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB", 6),
        ("Tesla V100-PCIE-16GB", "V100 PCIe 16GB", 0),
        ("Tesla V100-PCIE-32GB", "V100 PCIe 32GB", 0),
        ("NVIDIA RTX A5000", "RTX A5000", 0),
        ("NVIDIA RTX A4000", "RTX A4000", 0),
    ],
)
def test_rental_cards_are_in_the_table(name: str, model: str, sxm_links: int) -> None:
    spec = datasheet.lookup(name)
    assert spec is not None and spec.model == model and spec.nvlink_links == sxm_links
    assert (spec.bf16_tflops or spec.fp16_tflops) and spec.mem_bw_gb_s and spec.tdp_w
    assert (spec.fp16_tflops is not None) == (spec.cc < (8, 0))  # bf16 peaks from Ampere on, fp16 before


def test_pcie_slot_below_the_card_blames_the_platform() -> None:
    """When NVML says the slot itself tops out below the card, no riser or BIOS hint."""
    [r] = g.gpu_pcie(machine(gpus=(gpu(pcie_gen_max=4, pcie_gen_loaded=4, pcie_width_loaded=16),)), config())
    assert "tops out at Gen4" in r.summary and r.hint is not None
    assert r.hint.startswith("the platform limits the link") and "riser" not in r.hint
    [r] = g.gpu_pcie(machine(gpus=(gpu(pcie_width_max=8),)), config())  # an x8 slot: lanes, not the platform gen
    assert "x8 slot, a riser or bifurcation" in (r.hint or "")
    [r] = g.gpu_pcie(machine(gpus=(gpu(pcie_gen_loaded=4, pcie_width_loaded=16),)), config())  # trained down
    assert "trained below what slot and card both support" in (r.hint or "")


def test_throttle_reasons() -> None:
    assert _status(g.gpu_throttle, clock_event_reasons=0x1 | 0x2 | 0x100) is Status.OK  # idle, app clocks, display
    assert _status(g.gpu_throttle, clock_event_reasons=g.SW_POWER_CAP) is Status.WARN
    assert _status(g.gpu_throttle, clock_event_reasons=g.HW_THERMAL | g.SW_POWER_CAP) is Status.FAIL
    assert _status(g.gpu_throttle, clock_event_reasons=None) is Status.SKIP


def test_ecc_lifetime_errors_warn_and_volatile_fail() -> None:
    assert _status(g.gpu_ecc, ecc_uncorrected_aggregate=2) is Status.WARN
    assert _status(g.gpu_ecc, ecc_uncorrected_volatile=1) is Status.FAIL
    assert _status(g.gpu_ecc, retired_pages_pending=True) is Status.FAIL
    consumer = {"ecc_enabled": None, "remapped_rows": None, "retired_pages_pending": None}
    assert _status(g.gpu_ecc, **consumer) is Status.OK


def test_mig_states() -> None:
    assert _status(g.gpu_mig, mig_enabled=None) is Status.OK
    assert _status(g.gpu_mig, mig_enabled=False, mig_pending=True) is Status.WARN
    assert _status(g.gpu_mig, mig_enabled=True, mig_devices=0) is Status.FAIL


def test_processes_by_share_of_memory_and_hidden_tenants() -> None:
    few = (GpuProcess(pid=1, used_memory=10 * GIB),)
    many = (GpuProcess(pid=1, used_memory=50 * GIB),)
    assert _status(g.gpu_processes, processes=few) is Status.WARN
    assert _status(g.gpu_processes, processes=many) is Status.FAIL
    assert _status(g.gpu_processes, processes=(), memory_used=20 * GIB) is Status.WARN  # no process, 20 GiB used
    assert _status(g.gpu_processes, processes=(), memory_used=int(4.5 * GIB)) is Status.WARN  # 5.6% > 5%
    assert _status(g.gpu_processes, processes=None) is Status.SKIP


def test_compute_mode_and_persistence() -> None:
    assert _status(g.gpu_compute_mode, compute_mode=2) is Status.FAIL
    assert _status(g.gpu_compute_mode, compute_mode=3) is Status.WARN
    assert _status(g.gpu_compute_mode, compute_mode=1) is Status.WARN
    assert _status(g.gpu_persistence, persistence_mode=False) is Status.WARN


def test_lost_gpu_is_one_failed_inventory_entry_and_skipped_elsewhere() -> None:
    m = machine(gpus=(gpu(0), gpu(1, error="GPU is lost")))
    inv = g.gpu_inventory(m, config())
    assert [(r.subject, r.status) for r in inv] == [("gpu0", Status.OK), ("gpu1", Status.FAIL)]
    assert [r.subject for r in g.gpu_power(m, config())] == ["gpu0"]


def test_unknown_card_is_not_judged_against_another_cards_datasheet() -> None:
    [r] = g.gpu_inventory(machine(gpus=(gpu(name="NVIDIA Mystery 9000"),)), config())
    assert "not in the datasheet table" in r.summary


def test_failed_queries_are_shown_and_missing_power_cables_fail() -> None:
    assert _status(g.gpu_inventory, query_errors=("nvmlDeviceGetEccMode: Unknown Error",)) is Status.WARN
    assert (
        _status(g.gpu_inventory, query_errors=("nvmlDeviceGetPowerUsage: Insufficient External Power",)) is Status.FAIL
    )
