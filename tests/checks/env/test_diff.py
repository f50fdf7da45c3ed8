"""invoke diff's ranking on replayed snapshots edited to differ in one field each, reports old and new, and the CLI."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.env.diff import diff, same_release
from checks.env.render import render_diff
from checks.env.view import from_facts, load_side
from checks.facts import EnvFacts, MachineFacts
from checks.snapshot import dump_snapshot, load_snapshot, write_snapshot

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "machines"


def base() -> MachineFacts:
    facts, _ = load_snapshot(FIXTURES / "h200-1x.json")
    env = EnvFacts(os_name="Ubuntu 24.04", python="3.12.3", packages={"numpy": "2.1.0", "torch": "2.9.1+cu128"})
    return dataclasses.replace(facts, env=env)


def edit(m: MachineFacts, **parts: dict[str, Any]) -> MachineFacts:
    """Replace fields of the named sections (torch, host, env, nvml, gpu0)."""
    out = m
    for section, fields in parts.items():
        if section == "gpu0":
            gpu = dataclasses.replace(out.nvml.gpus[0], **fields)
            out = dataclasses.replace(out, nvml=dataclasses.replace(out.nvml, gpus=(gpu,)))
        else:
            out = dataclasses.replace(out, **{section: dataclasses.replace(getattr(out, section), **fields)})
    return out


def ranked(b: MachineFacts) -> dict[str, str]:
    return {d.field: d.rank for d in diff(from_facts(base(), "A"), from_facts(b, "B")).differences}


CASES = [
    ("nccl minor", {"torch": {"nccl_version": "2.21.5"}}, "nccl", "break"),
    ("nccl patch", {"torch": {"nccl_version": "2.27.7"}}, "nccl", "info"),
    ("python minor", {"env": {"python": "3.11.9"}}, "python", "break"),
    ("python patch", {"env": {"python": "3.12.8"}}, "python", "info"),
    ("missing package", {"env": {"packages": {"torch": "2.9.1+cu128"}}}, "package:numpy", "break"),
    ("package version", {"env": {"packages": {"numpy": "1.26.4", "torch": "2.9.1+cu128"}}}, "package:numpy", "info"),
    ("extra package", {"env": {"packages": {"numpy": "2.1.0", "torch": "2.9.1+cu128", "x": "1"}}}, "package:x", "info"),
    (
        "driver too old",
        {"nvml": {"cuda_driver_version": 11080, "driver_version": "520.61.05"}},
        "torch_cuda vs driver",
        "break",
    ),
    ("arch missing", {"torch": {"arch_list": ("sm_80", "sm_86")}}, "sm_90 vs arch list", "break"),
    ("power cap", {"gpu0": {"power_limit_mw": 450_000}}, "gpu0.power_limit_w", "slow"),
    ("more power", {"gpu0": {"power_limit_mw": 800_000}}, "gpu0.power_limit_w", "info"),
    ("pcie", {"gpu0": {"pcie_gen_max": 4, "pcie_gen_loaded": 4}}, "gpu0.pcie", "slow"),
    ("clocks", {"gpu0": {"sm_clock_max_mhz": 1410}}, "gpu0.sm_clock_max_mhz", "slow"),
    ("cores", {"host": {"cpu_affinity": 8}}, "cores", "slow"),
    ("shm", {"host": {"shm_total": 64 * 2**20}}, "shm_mib", "slow"),
    ("os", {"env": {"os_name": "Ubuntu 22.04"}}, "os", "info"),
]


@pytest.mark.parametrize(("what", "change", "field", "rank"), CASES, ids=[c[0] for c in CASES])
def test_each_field_is_ranked(what: str, change: dict[str, Any], field: str, rank: str) -> None:
    got = ranked(edit(base(), **change))
    assert got.get(field) == rank, got


def test_same_box_has_no_differences_and_exits_0() -> None:
    d = diff(from_facts(base(), "A"), from_facts(base(), "B"))
    assert d.differences == () and d.exit_code() == 0


def test_versions_compare_by_pep440_not_as_strings() -> None:
    assert ranked(edit(base(), env={"packages": {"numpy": "2.1", "torch": "2.9.1+cu128"}})) == {}  # 2.1 == 2.1.0
    assert same_release("2.10.0", "2.10.3", 2) and not same_release("2.9.0", "2.10.0", 2)
    d = diff(
        from_facts(base(), "A"),
        from_facts(edit(base(), env={"packages": {"numpy": "2.10.0", "torch": "2.9.1+cu128"}}), "B"),
    )
    assert "(B is newer)" in d.differences[0].reason  # "2.10.0" < "2.1.0" as strings


def test_different_gpu_counts_compare_what_exists() -> None:
    eight, _ = load_snapshot(FIXTURES / "h100-sxm-8x-healthy.json")
    d = diff(from_facts(base(), "A"), from_facts(eight, "B"))
    fields = {x.field for x in d.differences}
    assert "gpu_count" in fields and "gpu0.name" in fields and not any(f.startswith("gpu7") for f in fields)
    assert any("predates" in m for m in d.not_compared)  # B is an old snapshot without the env section


def test_another_gpu_model_s_own_figures_are_not_ranked_slow() -> None:
    # An RTX 4090 box against an H200: the H200's lower clock ceiling is not a slowdown of the same card. The same
    # card with a lower ceiling still is (the "clocks" case above).
    capped, _ = load_snapshot(FIXTURES / "rtx4090-power-capped.json")
    d = diff(from_facts(capped, "A"), from_facts(base(), "B"))
    by = {x.field: x for x in d.differences}
    assert by["gpu0.name"].rank == "info"
    for field in ("gpu0.sm_clock_max_mhz", "gpu0.power_limit_w"):
        assert by[field].rank == "info", by[field]
        assert "another GPU model (NVIDIA GeForce RTX 4090 vs NVIDIA H200)" in by[field].reason, by[field]
    assert not any(x.rank == "slow" and x.field.startswith("gpu0.") for x in d.differences), d.differences
    # the host's side of a GPU (its NUMA node's CPUs) still compares across models
    a, b = from_facts(capped, "A"), from_facts(base(), "B")
    a = dataclasses.replace(a, fields={**a.fields, "gpu0.local_cpus": 64})
    b = dataclasses.replace(b, fields={**b.fields, "gpu0.local_cpus": 32})
    local = next(x for x in diff(a, b).differences if x.field == "gpu0.local_cpus")
    assert local.rank == "slow" and "another GPU model" not in local.reason, local


def _report(tmp_path: Path, name: str, measurements: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {"schema": 1, "tool": "x", "host": "h", "machine": "live", "results": [], "measurements": measurements}
        )
    )
    return path


def test_old_report_against_a_snapshot_says_what_cannot_be_compared(tmp_path: Path) -> None:
    old = _report(
        tmp_path,
        "old.json",
        {
            "dataloader": {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2},
            "inventory": {"gpus": 1, "gpu_names": ["NVIDIA H200"], "torch": "2.8.0", "cuda": True, "nccl": "2.27.5"},
        },
    )
    d = diff(load_side(str(FIXTURES / "h200-1x.json")), load_side(str(old)))
    assert [x.field for x in d.differences] == ["torch"]
    assert any("predates measurements.environment" in m for m in d.not_compared)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "diff", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_snapshot(a, dump_snapshot(base(), recorded=False))
    write_snapshot(b, dump_snapshot(edit(base(), torch={"nccl_version": "2.21.5"}), recorded=False))
    broke = _cli(str(a), str(b), "--json", "-")
    assert broke.returncode == 1, broke.stderr
    doc = json.loads(broke.stdout)
    assert doc["diff"] == 1 and doc["counts"]["break"] == 1 and doc["differences"][0]["field"] == "nccl"
    assert "BREAK nccl" in broke.stderr
    assert _cli(str(a), str(a)).returncode == 0
    bad = _cli(str(a), str(tmp_path / "nope.json"))
    assert bad.returncode == 2 and "nope.json does not exist" in bad.stderr and "Traceback" not in bad.stderr


def _on_two_sockets(m: MachineFacts) -> MachineFacts:
    """The 4-GPU box with GPUs 2 and 3 moved to NUMA node 1 (32 CPUs each) and their pairs with 0 and 1 SYS."""
    topo = m.topology
    assert topo is not None and len(topo.gpus) == 4
    far = {2, 3}
    gpus = tuple(
        dataclasses.replace(g, numa_node=1, cpus=tuple(range(64, 96))) if g.index in far else g for g in topo.gpus
    )
    pairs = tuple(dataclasses.replace(p, level=50) if (p.a in far) != (p.b in far) else p for p in topo.pairs)
    return dataclasses.replace(m, topology=dataclasses.replace(topo, gpus=gpus, pairs=pairs))


def test_numa_placement_is_compared_and_a_split_box_is_slow() -> None:
    one, _ = load_snapshot(FIXTURES / "rtx4090-4x-no-p2p.json")
    split = _on_two_sockets(one)
    d = diff(from_facts(one, "A"), from_facts(split, "B"))
    got = {x.field: (x.rank, x.a, x.b) for x in d.differences}
    assert got == {
        "cross_socket_pairs": ("slow", 0, 4),
        "gpu2.local_cpus": ("slow", 64, 32),
        "gpu3.local_cpus": ("slow", 64, 32),
        "gpu2.numa_node": ("info", 0, 1),
        "gpu3.numa_node": ("info", 0, 1),
    }
    back = {x.field: x.rank for x in diff(from_facts(split, "A"), from_facts(one, "B")).differences}
    assert set(back.values()) == {"info"} and "cross_socket_pairs" in back  # B is the better placed box


def test_numa_is_not_compared_when_one_side_has_no_topology() -> None:
    four, _ = load_snapshot(FIXTURES / "rtx4090-4x-no-p2p.json")
    d = diff(from_facts(dataclasses.replace(four, topology=None), "A"), from_facts(four, "B"))
    assert not any("numa" in x.field or "cross_socket" in x.field for x in d.differences)
    assert any(m.startswith("NUMA placement: only one side") for m in d.not_compared)


def _fixture_diff(a: str, b: str) -> dict[str, tuple[str, str]]:
    d = diff(load_side(str(FIXTURES / f"{a}.json")), load_side(str(FIXTURES / f"{b}.json")))
    return {x.field: (x.rank, x.reason) for x in d.differences}


def test_losing_the_gpu_the_driver_and_the_cuda_build_are_breaks() -> None:
    got = _fixture_diff("h200-1x", "cpu-only-no-driver")  # B: no driver, no GPU, a CPU build of torch
    assert {f: got[f][0] for f in ("gpu_count", "driver", "torch_cuda")} == dict.fromkeys(
        ("gpu_count", "driver", "torch_cuda"), "break"
    )
    assert "older" not in got["gpu_count"][1] and "newer" not in got["gpu_count"][1]
    back = _fixture_diff("cpu-only-no-driver", "h200-1x")  # B gains all three: nothing breaks
    assert {back[f][0] for f in ("gpu_count", "driver", "torch_cuda")} == {"info"}
    assert "B has more" in back["gpu_count"][1]


def test_a_cpu_build_of_torch_on_a_gpu_box_is_a_break() -> None:
    got = _fixture_diff("h200-1x", "h100-cpu-torch")
    assert got["torch_cuda"][0] == "break" and "not built for CUDA" in got["torch_cuda"][1]
    assert got["driver"][0] == "info" and "gpu_count" not in got  # both have one GPU and a driver


def test_fewer_gpus_are_slow_and_the_reason_says_fewer() -> None:
    eight, _ = load_snapshot(FIXTURES / "h100-sxm-8x-healthy.json")
    d = diff(from_facts(eight, "A"), from_facts(base(), "B"))
    got = {x.field: x for x in d.differences}
    assert got["gpu_count"].rank == "slow" and "B has fewer" in got["gpu_count"].reason


@pytest.mark.parametrize(
    ("b", "row"),
    [("driver-too-old-major", "torch_cuda vs driver"), ("h100-cpu-torch", None), ("cpu-only-no-driver", None)],
)
def test_a_reason_that_points_at_another_row_names_one_that_exists(b: str, row: str | None) -> None:
    d = diff(load_side(str(FIXTURES / "h200-1x.json")), load_side(str(FIXTURES / f"{b}.json")))
    fields = {x.field for x in d.differences}
    assert (row in fields) if row else ("torch_cuda vs driver" not in fields)
    for x in d.differences:
        assert "below" not in x.reason and "judged under" not in x.reason, x
        named = re.findall(r"the `([^`]+)` row", x.reason)
        assert all(n in fields for n in named), (x, fields)
    if row:
        assert f"the `{row}` row" in {x.field: x.reason for x in d.differences}["torch_cuda"]


def test_a_cuda_build_the_driver_runs_says_so() -> None:
    b = edit(base(), torch={"cuda": "12.6"})
    d = {x.field: x for x in diff(from_facts(base(), "A"), from_facts(b, "B")).differences}
    assert d["torch_cuda"].rank == "info" and "B's driver (CUDA 13.0) runs it" in d["torch_cuda"].reason


# --- many packages: the ones that matter named, the rest counted ----------------------------------------------


def _crowded() -> tuple[MachineFacts, MachineFacts]:
    """A: torch, numpy, NCCL and 150 other packages; B: a newer torch and numpy, another NCCL, 120 of the others
    gone, 20 at another version, and 8 of its own."""
    others = {f"lib{i:03d}": "1.0" for i in range(150)}
    mine = {"torch": "2.9.1+cu128", "numpy": "2.1.0", "nvidia-nccl-cu12": "2.27.3", "transformers": "4.56.0"}
    a_packages = {**mine, **others}
    b_packages = {"torch": "2.9.1+cu128", "numpy": "2.2.0", "nvidia-nccl-cu12": "2.26.2", "transformers": "4.56.0"}
    b_packages |= {f"lib{i:03d}": "2.0" for i in range(120, 140)} | {f"lib{i:03d}": "1.0" for i in range(140, 150)}
    b_packages |= {f"extra{i}": "0.1" for i in range(8)}
    a = edit(base(), env={"packages": a_packages})
    return a, edit(base(), env={"packages": b_packages}, torch={"version": "2.10.0+cu128"})


def test_many_package_differences_name_what_matters_and_count_the_rest() -> None:
    a, b = _crowded()
    d = diff(from_facts(a, "A"), from_facts(b, "B"))
    assert sum(x.field.startswith("package:") for x in d.differences) == 150
    text = render_diff(d, matter=("numpy", "transformers"))
    lines = text.splitlines()
    assert not any("package:lib" in line or "package:extra" in line for line in lines), text
    assert any(line.startswith("  INFO  package:numpy ") and "2.1.0 -> 2.2.0" in line for line in lines), text
    assert any(line.startswith("  INFO  package:nvidia-nccl-cu12 ") for line in lines), text
    [broken] = [line for line in lines if line.startswith("  BREAK packages")]
    assert "120 other packages missing on B" in broken and "lib000, lib001, lib002, lib003 and 116 more" in broken
    [info] = [line for line in lines if line.startswith("  INFO  packages")]
    assert "28 other packages: 20 at another version: lib120," in info and "8 only on B: extra0," in info
    assert "  packages: 150 differ: 2 that matter (numpy, 1 nvidia-* library) + 148 others; --all lists them" in lines
    assert len(lines) < 25, text  # the point stays on one screen
    assert lines[-2] == f"{d.counts()['break']} break · {d.counts()['slow']} slow · {d.counts()['info']} info"


def test_all_lists_every_package_row_and_few_others_are_listed_anyway() -> None:
    a, b = _crowded()
    d = diff(from_facts(a, "A"), from_facts(b, "B"))
    every = render_diff(d, every_row=True)
    assert sum("package:lib" in line or "package:extra" in line for line in every.splitlines()) == 148
    assert "BREAK packages" not in every and "--all" not in every
    few = edit(base(), env={"packages": {"numpy": "2.1.0", "torch": "2.9.1+cu128", "x": "1", "y": "2"}})
    text = render_diff(diff(from_facts(base(), "A"), from_facts(few, "B")))
    assert "INFO  package:x" in text and "INFO  package:y" in text and "packages:" not in text


@pytest.mark.slow
def test_cli_groups_packages_unless_all(tmp_path: Path) -> None:
    a, b = _crowded()
    write_snapshot(tmp_path / "a.json", dump_snapshot(a, recorded=False))
    write_snapshot(tmp_path / "b.json", dump_snapshot(b, recorded=False))
    short = _cli(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert short.returncode == 1 and "BREAK packages" in short.stdout and "package:lib000" not in short.stdout
    assert "2 that matter (numpy, 1 nvidia-* library)" in short.stdout  # numpy from preflight.env.packages
    full = _cli(str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--all")
    assert full.returncode == 1 and "package:lib000" in full.stdout and "BREAK packages" not in full.stdout


def test_torchs_cuda_libraries_missing_together_are_one_line_naming_each() -> None:
    libs = ("nvidia-cublas-cu12", "nvidia-cudnn-cu12", "nvidia-nccl-cu12", "nvidia-cusparse-cu12")
    a = edit(base(), env={"packages": {"numpy": "2.1.0", "torch": "2.9.1+cu128", **dict.fromkeys(libs, "1.0")}})
    text = render_diff(diff(from_facts(a, "A"), from_facts(base(), "B")))
    [line] = [line for line in text.splitlines() if "nvidia-" in line]
    assert line.startswith("  BREAK package:nvidia-* 4 nvidia-* libraries missing on B") and all(
        n in line for n in libs
    )
