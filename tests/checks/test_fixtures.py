"""Replay every machine snapshot in tests/fixtures/machines through all checks and assert its verdict.

Each fixture exists to show one verdict (its header's "description" says which). ``EXPECTED`` lists, per
fixture, the results that verdict consists of; it must name every FAIL and WARN the replay produces, so a
fixture shows exactly its scenario and a check that starts failing elsewhere is caught. A fixture file with
no entry in ``EXPECTED`` fails the suite.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from checks.config import make_config
from checks.facts import GpuFacts
from checks.machine.runner import CHECKS, run_checks
from checks.result import Result, Status
from checks.snapshot import load_snapshot
from checks.tables.torchbuilds import best_variant, driver_cuda

MACHINES = Path(__file__).resolve().parent.parent / "fixtures" / "machines"
BENCH_IDS = ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")  # gpu-bench reports under these ids
KNOWN_IDS = {check_id for check_id, _ in CHECKS} | set(BENCH_IDS)
OK, WARN, FAIL, SKIP, ERROR = Status.OK, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR
PROBLEMS = (FAIL, WARN)

# Checks with one result per answering GPU (gpu-inventory also reports GPUs that stopped answering).
PER_GPU_IDS = (
    "torch-arch", "gpu-power", "gpu-pcie", "gpu-nvlink", "gpu-throttle", "gpu-ecc", "gpu-mig",
    "gpu-processes", "gpu-persistence", "gpu-compute-mode",
)  # fmt: skip
# Machine-wide checks that judge host and build; subject None.
MACHINE_IDS = (
    "driver", "torch-build", "cuda-compat", "torch-libs", "cpu-cores", "ram", "shm", "ulimits",
    "dataloader-advice",
)  # fmt: skip
# Checks of a box with two or more GPUs; machine-wide, subject None.
BOX_IDS = ("gpu-topology", "gpu-p2p", "gpu-allreduce", "nccl-env")
HEALTHY = ("h100-sxm-8x-healthy.json", "h200-1x.json")

Expectation = tuple[str, str | None, Status]  # (check id, subject: "gpu0" or None, status)


def each(check_ids: tuple[str, ...], gpus: int, status: Status) -> list[Expectation]:
    """The same status for every GPU index below ``gpus`` under each of ``check_ids``."""
    return [(check_id, f"gpu{i}", status) for check_id in check_ids for i in range(gpus)]


def machine(status: Status, *check_ids: str) -> list[Expectation]:
    return [(check_id, None, status) for check_id in check_ids]


EXPECTED: dict[str, list[Expectation]] = {
    "cpu-only-no-driver.json": [
        ("driver", None, FAIL),
        *machine(SKIP, "gpu-inventory", "cuda-compat", "torch-libs", *PER_GPU_IDS, *BENCH_IDS),
        *machine(OK, "torch-build", "cpu-cores", "ram", "shm", "ulimits", "dataloader-advice"),
    ],
    # Recorded with `invoke snapshot` on the 2-vCPU VM this project is developed on: no driver, CPU torch, and
    # a real finding: the container's open-files limit is 20000, hard, below the 65536 many workers want.
    "recorded-cpu-vm-2vcpu.json": [
        ("driver", None, FAIL),
        ("ulimits", None, WARN),
        *machine(SKIP, "gpu-inventory", "cuda-compat", "torch-libs", *PER_GPU_IDS, *BENCH_IDS),
        *machine(OK, "torch-build", "cpu-cores", "ram", "shm", "dataloader-advice"),
    ],
    # A CPU VM (no NVIDIA device on its bus) with a CUDA torch wheel: no driver is no fault, nothing fails.
    "cpu-vm-cuda-wheel.json": [
        ("driver", None, SKIP),
        ("ulimits", None, WARN),
        *machine(SKIP, "gpu-inventory", "cuda-compat", *PER_GPU_IDS, *BENCH_IDS),
        *machine(OK, "torch-build", "cpu-cores", "ram", "shm", "dataloader-advice"),
    ],
    # The same VM with a CUDA torchvision from PyPI beside its CPU torch: importing it fails.
    "cpu-vm-cuda-torchvision.json": [
        ("driver", None, FAIL),
        ("ulimits", None, WARN),
        ("torch-extensions", None, FAIL),
        *machine(OK, "torch-build", "cpu-cores", "ram", "shm", "dataloader-advice"),
    ],
    "h100-sxm-8x-healthy.json": [
        *machine(OK, *MACHINE_IDS),
        *each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 8, OK),
    ],
    "recorded-h200-sxm-1x.json": [  # a real one-GPU H200 VM (tests/gpu/acceptance.sh, 2026-12-04)
        ("ram", None, WARN),
        ("ulimits", None, WARN),
        *machine(OK, "driver", "torch-build", "cuda-compat", "torch-libs", "cpu-cores", "shm", "dataloader-advice"),
        *each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 1, OK),
    ],
    "h200-1x.json": [
        *machine(OK, *MACHINE_IDS),
        *each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 1, OK),
    ],
    "rtx4090-power-capped.json": [
        ("gpu-power", "gpu0", WARN),
        ("gpu-throttle", "gpu0", OK),
        ("gpu-ecc", "gpu0", OK),
        *machine(OK, *MACHINE_IDS),
    ],
    "a100-pcie-gen3-x8.json": [
        ("gpu-pcie", "gpu0", FAIL),
        ("gpu-power", "gpu0", OK),
        *machine(OK, *MACHINE_IDS),
    ],
    "driver-too-old-major.json": [
        ("cuda-compat", None, FAIL),
        ("driver", None, OK),
        ("torch-build", None, OK),
        ("torch-libs", None, OK),
        ("torch-arch", "gpu0", OK),
    ],
    "driver-older-minor.json": [
        ("cuda-compat", None, WARN),
        ("torch-arch", "gpu0", OK),
        ("torch-libs", None, OK),
    ],
    "rtx5090-no-sm120.json": [
        ("torch-arch", "gpu0", FAIL),
        ("cuda-compat", None, OK),
        ("torch-build", None, OK),
    ],
    "h100-cpu-torch.json": [
        ("torch-build", None, FAIL),
        ("torch-arch", None, SKIP),
        ("torch-libs", None, SKIP),
        ("cuda-compat", None, OK),
    ],
    "geforce-forward-compat.json": [
        ("cuda-compat", None, FAIL),
        ("torch-arch", "gpu0", OK),
        ("torch-arch", "gpu1", OK),
    ],
    "nvswitch-no-fabric-manager.json": [
        ("cuda-compat", None, FAIL),
        *each(("gpu-inventory", "gpu-nvlink"), 8, OK),
    ],
    "mig-enabled.json": [
        ("gpu-mig", "gpu0", FAIL),
        ("gpu-mig", "gpu1", WARN),
        ("gpu-ecc", "gpu0", OK),
        ("gpu-ecc", "gpu1", OK),
    ],
    "foreign-processes.json": [
        ("gpu-processes", "gpu0", WARN),
    ],
    "remapped-rows-pending.json": [
        ("gpu-ecc", "gpu0", FAIL),
    ],
    "container-2cpu-64mb-shm.json": [
        ("cpu-cores", None, WARN),
        ("shm", None, FAIL),
        ("dataloader-advice", None, WARN),
        ("ram", None, OK),
    ],
    "gpu-lost.json": [
        ("gpu-inventory", "gpu1", FAIL),
        ("gpu-inventory", "gpu0", OK),
        *each(PER_GPU_IDS, 1, OK),
    ],
    "bench-outlier.json": [
        ("gpu-h2d", "gpu2", FAIL),
        *[("gpu-h2d", f"gpu{i}", OK) for i in (0, 1, 3)],
        *each(("gpu-d2h", "gpu-d2d", "gpu-matmul", "gpu-pcie"), 4, OK),
    ],
    # An SXM module the table does not know (no marker in its name; NVSwitches on the host say SXM): links down fail.
    "sxm-unlisted-nvlink-down.json": [
        ("gpu-nvlink", "gpu1", FAIL),
        *[("gpu-nvlink", f"gpu{i}", OK) for i in (0, 2, 3)],
        *each(("gpu-inventory", "gpu-pcie", "torch-arch"), 4, OK),
        *machine(OK, *MACHINE_IDS),
    ],
    # PCIe boards without a bridge: links that exist but are all inactive are "no bridge fitted", not a fault.
    "pcie-no-nvlink-bridge.json": [
        *each(("gpu-inventory", *PER_GPU_IDS), 2, OK),
        *machine(OK, *MACHINE_IDS),
    ],
    # GPU to GPU inside one box: topology from the fake pynvml of tests/checks/topology_machines.py,
    # recorded p2p matrices and local all-reduce sweeps.
    "h100-sxm-8x-nvlink.json": [
        *machine(OK, *MACHINE_IDS, *BOX_IDS),
        *each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 8, OK),
    ],
    "h100-sxm-8x-gpu3-nvlink-down.json": [  # judged by what the box is, not the path it has now
        ("gpu-nvlink", "gpu3", FAIL),
        *machine(FAIL, "gpu-topology", "gpu-p2p", "gpu-allreduce"),
        *machine(OK, *MACHINE_IDS, "nccl-env"),
        *[e for e in each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 8, OK) if e[:2] != ("gpu-nvlink", "gpu3")],
    ],
    "h100-sxm-8x-cpuset-node0.json": [  # a cpuset without the node of gpu4-7
        ("gpu-topology", None, WARN),
        *machine(OK, *MACHINE_IDS, "gpu-p2p", "gpu-allreduce", "nccl-env"),
        *each(("gpu-inventory", *PER_GPU_IDS, *BENCH_IDS), 8, OK),
    ],
    "a100-pcie-8x-two-sockets.json": [
        ("gpu-topology", None, WARN),
        ("gpu-allreduce", None, FAIL),
        *machine(OK, *MACHINE_IDS, "gpu-p2p", "nccl-env"),
        *each(("gpu-inventory", "gpu-nvlink", "gpu-pcie"), 8, OK),
    ],
    "rtx4090-4x-no-p2p.json": [
        *machine(OK, *MACHINE_IDS, *BOX_IDS),
        *each(("gpu-inventory", "gpu-power", "gpu-nvlink"), 4, OK),
    ],
    "h100-pcie-2x-bridge.json": [
        *machine(OK, *MACHINE_IDS, *BOX_IDS),
        *each(("gpu-inventory", "gpu-nvlink", "gpu-pcie"), 2, OK),
    ],
}

FIXTURE_NAMES = sorted(EXPECTED)


@cache
def replay(name: str) -> tuple[Result, ...]:
    """Load a fixture and run every check on it with the default configuration."""
    facts, _ = load_snapshot(MACHINES / name)
    return tuple(run_checks(facts, make_config()))


def result(name: str, check_id: str, subject: str | None) -> Result:
    """The one result of ``check_id`` about ``subject`` in the replay of ``name``."""
    found = [r for r in replay(name) if r.id == check_id and r.subject == subject]
    assert len(found) == 1, f"{name}: {len(found)} results for {check_id} @ {subject}"
    return found[0]


def case_id(name: str, e: Expectation) -> str:
    """``h200-1x:gpu-nvlink@gpu0``: fixture, check id and subject of one expected verdict."""
    return f"{name.removesuffix('.json')}:{e[0]}@{e[1] or 'machine'}"


def render(results: tuple[Result, ...] | list[Result]) -> str:
    return "\n".join(f"  {r.status.value} {r.id} @ {r.subject}: {r.summary}" for r in results)


# --- the table and the files agree -------------------------------------------------------------------------


def test_every_fixture_file_has_expectations() -> None:
    files = {p.name for p in MACHINES.glob("*.json")}
    assert files, f"no fixtures under {MACHINES}"
    assert sorted(files - set(EXPECTED)) == [], "fixtures without expectations: add them to EXPECTED"
    assert sorted(set(EXPECTED) - files) == [], "expectations for fixtures that do not exist"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_header_says_what_the_fixture_is(name: str) -> None:
    _, header = load_snapshot(MACHINES / name)
    assert header["snapshot"] == 1
    assert isinstance(header.get("recorded"), bool)
    assert isinstance(header.get("description"), str) and len(header["description"]) > 40


# --- verdicts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "check_id", "subject", "status"),
    [(name, *e) for name in FIXTURE_NAMES for e in EXPECTED[name]],
    ids=[case_id(name, e) for name in FIXTURE_NAMES for e in EXPECTED[name]],
)
def test_expected_verdict(name: str, check_id: str, subject: str | None, status: Status) -> None:
    r = result(name, check_id, subject)
    assert r.status is status, f"{name}: {check_id} @ {subject} is {r.status.value}: {r.summary}"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_problem_is_expected(name: str) -> None:
    """The FAILs and WARNs of a replay are exactly those in the table: nothing else is wrong."""
    seen = {(r.id, r.subject, r.status) for r in replay(name) if r.status in PROBLEMS}
    wanted = {e for e in EXPECTED[name] if e[2] in PROBLEMS}
    problems = [r for r in replay(name) if r.status in PROBLEMS]
    assert seen == wanted, f"{name}:\n{render(problems)}"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_no_check_errors(name: str) -> None:
    errors = [r for r in replay(name) if r.status is ERROR]
    assert not errors, f"{name}:\n{render(errors)}"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_result_ids_are_known(name: str) -> None:
    assert sorted({r.id for r in replay(name)} - KNOWN_IDS) == []


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_machine_has_no_fail_or_warn(name: str) -> None:
    bad = [r for r in replay(name) if r.status in (*PROBLEMS, ERROR)]
    assert not bad, f"{name}:\n{render(bad)}"


@pytest.mark.parametrize("name", [*HEALTHY, "bench-outlier.json"])
def test_recorded_bench_is_judged_for_every_gpu(name: str) -> None:
    facts, _ = load_snapshot(MACHINES / name)
    assert facts.bench is not None and facts.bench.recorded
    gpus = {f"gpu{g.index}" for g in facts.nvml.gpus}
    for check_id in BENCH_IDS:
        judged = [r for r in replay(name) if r.id == check_id]
        assert {r.subject for r in judged} == gpus
        assert all("[recorded]" in r.summary and "datasheet figure" in r.summary for r in judged)


# --- what each scenario's result says --------------------------------------------------------------------


def test_no_driver_fails_once_and_skips_every_gpu_check() -> None:
    results = replay("cpu-only-no-driver.json")
    gpu_results = [r for r in results if r.id.startswith("gpu-") or r.id == "torch-arch"]
    assert gpu_results and all(r.status is SKIP for r in gpu_results), render(gpu_results)
    assert [r.id for r in results if r.status is FAIL] == ["driver"]
    assert "NVML Shared Library Not Found" in result("cpu-only-no-driver.json", "driver", None).summary


def test_power_cap_names_both_limits() -> None:
    summary = result("rtx4090-power-capped.json", "gpu-power", "gpu0").summary
    assert "250 W" in summary and "450 W" in summary


def test_narrow_link_names_the_slot() -> None:
    r = result("a100-pcie-gen3-x8.json", "gpu-pcie", "gpu0")
    assert r.value == "Gen3 x8" and r.expected == "Gen4 x16"


def test_driver_too_old_hint_names_the_build_the_driver_runs() -> None:
    facts, _ = load_snapshot(MACHINES / "driver-too-old-major.json")
    variant = best_variant(
        [g.compute_capability for g in facts.nvml.gpus if g.compute_capability],
        driver_cuda(facts.nvml.cuda_driver_version),
    )
    assert variant is not None and variant.name == "cu121"  # the newest <= 12.2: docs/sources.md#torch-wheel-arch-lists
    r = result("driver-too-old-major.json", "cuda-compat", None)
    assert variant.name in (r.hint or "")
    assert "12.2" in r.summary and "13.0" in r.summary


def test_older_minor_driver_is_minor_version_compatibility() -> None:
    assert "minor-version compatibility" in result("driver-older-minor.json", "cuda-compat", None).summary


def test_missing_sm120_hint_names_cu128() -> None:
    r = result("rtx5090-no-sm120.json", "torch-arch", "gpu0")
    assert "sm_120" in r.summary
    assert "cu128" in (r.hint or "")


def test_cpu_torch_on_gpu_box_asks_for_a_cuda_build() -> None:
    assert "cu128" in (result("h100-cpu-torch.json", "torch-build", None).hint or "")


def test_a_torchvision_for_another_torch_names_the_build_that_loads() -> None:
    r = result("cpu-vm-cuda-torchvision.json", "torch-extensions", None)
    assert "operator torchvision::nms does not exist" in r.summary and "torch 2.13.0+cpu" in r.summary
    assert (r.hint or "").endswith(
        "pip uninstall -y torchvision && pip install torch==2.13.0 'torchvision==0.28.*' "
        "--index-url https://download.pytorch.org/whl/cpu"
    )


def test_a_snapshot_without_the_extension_probe_skips_it() -> None:
    r = result("recorded-cpu-vm-2vcpu.json", "torch-extensions", None)
    assert r.status is SKIP and "not recorded" in r.summary


@pytest.mark.parametrize(
    ("name", "code"), [("geforce-forward-compat.json", "804"), ("nvswitch-no-fabric-manager.json", "802")]
)
def test_cuda_init_failure_names_its_error_code(name: str, code: str) -> None:
    assert code in result(name, "cuda-compat", None).summary


def test_row_remap_pending_is_named() -> None:
    assert "row remap pending" in result("remapped-rows-pending.json", "gpu-ecc", "gpu0").summary


def test_foreign_processes_are_counted() -> None:
    r = result("foreign-processes.json", "gpu-processes", "gpu0")
    assert r.value == 2 and "30.0 GiB" in r.summary


def test_tiny_container_gets_no_workers() -> None:
    assert result("container-2cpu-64mb-shm.json", "cpu-cores", None).value == 2.0
    advice = result("container-2cpu-64mb-shm.json", "dataloader-advice", None)
    assert isinstance(advice.value, dict) and advice.value["num_workers"] == 0
    assert advice.value["persistent_workers"] is False and advice.value["prefetch_factor"] is None


def test_lost_gpu_is_one_entry_and_not_judged_further() -> None:
    results = replay("gpu-lost.json")
    assert {r.subject for r in results if r.id == "gpu-inventory"} == {"gpu0", "gpu1"}
    for check_id in PER_GPU_IDS:
        assert {r.subject for r in results if r.id == check_id} == {"gpu0"}, check_id
    assert "GPU is lost" in result("gpu-lost.json", "gpu-inventory", "gpu1").summary


def test_bench_outlier_is_flagged_against_its_siblings() -> None:
    r = result("bench-outlier.json", "gpu-h2d", "gpu2")
    assert "outlier" in r.summary
    others = [x for x in replay("bench-outlier.json") if x.id == "gpu-h2d" and x.subject != "gpu2"]
    assert all("outlier" not in x.summary for x in others)


def test_unlisted_sxm_links_down_name_the_evidence_and_no_bridge() -> None:
    r = result("sxm-unlisted-nvlink-down.json", "gpu-nvlink", "gpu1")
    assert "SXM part" in r.summary and "NVSwitch" in r.summary and "bridge seating" not in (r.hint or "")
    assert r.value == 12 and r.expected == "18 active"


def test_platform_limited_slot_blames_the_platform_not_a_riser() -> None:
    r = result("a100-pcie-gen3-x8.json", "gpu-pcie", "gpu0")
    assert "tops out at Gen3 x8" in r.summary
    assert (r.hint or "").startswith("the platform limits the link") and "riser" not in (r.hint or "")


def test_h200_nvlink_is_complete() -> None:
    r = result("h200-1x.json", "gpu-nvlink", "gpu0")
    assert r.value == 18 and r.expected == "18 active"


# --- variants of a fixture -------------------------------------------------------------------------------


def test_forward_compat_804_on_a_non_geforce_card_still_fails() -> None:
    """_forward_compat names GeForce only; an 804 on another card must still fail through the init error."""
    facts, _ = load_snapshot(MACHINES / "geforce-forward-compat.json")

    # A TITAN RTX is no GeForce and no data-center part: forward compatibility is not supported on it either.
    def titan(g: GpuFacts) -> GpuFacts:
        return replace(g, name="NVIDIA TITAN RTX", brand="titan-rtx", compute_capability=(7, 5))

    variant = replace(facts, nvml=replace(facts.nvml, gpus=tuple(map(titan, facts.nvml.gpus))))
    r = next(r for r in run_checks(variant, make_config()) if r.id == "cuda-compat")
    assert r.status is FAIL and "804" in r.summary
