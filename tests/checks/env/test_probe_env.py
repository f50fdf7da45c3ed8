"""The environment probe on a fake root, real nvcc stand-ins (processes), redaction, and snapshots old and new."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from checks.facts import EnvFacts
from checks.probe.env import nvcc_release, read_env, requirement_closure, variables
from checks.snapshot import dump_snapshot, load_snapshot, write_snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machines"


def _root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text('PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nVERSION_ID="22.04"\n')
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile\n"
    )
    return tmp_path


def _nvcc(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvcc"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_os_cpu_flags_and_nvcc_on_path_are_read(tmp_path: Path) -> None:
    release = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V12.8.93"
    nvcc = _nvcc(tmp_path / "bin", f"printf '{release}\\n'")
    env = read_env(_root(tmp_path), {"PATH": str(nvcc.parent)}, distributions=[])
    assert (env.os_name, env.os_id) == ("Ubuntu 22.04.5 LTS", "ubuntu 22.04")
    assert env.cpu_model == "Intel(R) Xeon(R) Platinum 8480+"
    assert env.cpu_flags == ("avx2", "avx512f", "amx_tile", "amx_bf16")
    assert (env.nvcc_version, env.nvcc_path, env.nvcc_error) == ("12.8", str(nvcc), None)


def test_nvcc_under_cuda_home_and_a_hung_one_is_cut_off(tmp_path: Path) -> None:
    _nvcc(tmp_path / "cuda" / "bin", "exec sleep 30")
    start = time.monotonic()
    env = read_env(_root(tmp_path), {"PATH": "", "CUDA_HOME": str(tmp_path / "cuda")}, nvcc_timeout_s=0.5)
    assert time.monotonic() - start < 5
    assert env.nvcc_version is None and "no answer within 0.5 s" in (env.nvcc_error or "")
    assert env.cuda_home == str(tmp_path / "cuda")


@pytest.mark.skipif(
    os.access("/usr/local/cuda/bin/nvcc", os.X_OK),
    reason="this machine has /usr/local/cuda/bin/nvcc (the last place looked)",
)
def test_no_nvcc_anywhere_is_none_not_an_error(tmp_path: Path) -> None:
    env = read_env(_root(tmp_path), {"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "nothing")}, distributions=[])
    assert (env.nvcc_path, env.nvcc_version, env.nvcc_error) == (None, None, None)


def test_a_missing_nvcc_is_an_error_of_its_own(tmp_path: Path) -> None:
    assert nvcc_release(str(tmp_path / "missing-nvcc"), 1.0)[1] is not None


def test_variables_keep_what_changes_training_and_hide_secrets() -> None:
    seen = variables({
        "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "8", "HF_TOKEN": "hf_abcdefabcdef",
        "HF_ENDPOINT": "https://user:pw@mirror.example/hf?sig=abc", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
        "NCCL_IB_AUTH_KEY": "s3cret",
    })  # fmt: skip
    assert seen["NCCL_DEBUG"] == "INFO" and seen["OMP_NUM_THREADS"] == "8" and seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert seen["HF_TOKEN"] == "<redacted>" and seen["NCCL_IB_AUTH_KEY"] == "<redacted>"
    assert "pw" not in seen["HF_ENDPOINT"] and "sig=abc" not in seen["HF_ENDPOINT"]
    assert "mirror.example" in seen["HF_ENDPOINT"]
    assert "HOME" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen


def test_live_packages_and_the_requirement_closure() -> None:
    env = read_env(nvcc_timeout_s=5.0)
    assert env.packages["invoke"] and env.packages["pyyaml"]  # PEP 503 names
    closure = requirement_closure(["fabric", "no-such-distribution"])
    assert {"fabric", "invoke", "paramiko"} <= set(closure) and "no-such-distribution" not in closure
    assert closure["invoke"] == env.packages["invoke"]


def test_every_older_fixture_still_loads_without_the_env_section() -> None:
    older = 0
    for path in sorted(FIXTURES.glob("*.json")):
        facts, _ = load_snapshot(path)
        if "env" in json.loads(path.read_text(encoding="utf-8"))["machine"]:  # recorded since (recorded-h200-sxm-1x)
            assert facts.env is not None and facts.env.packages, path.name
            continue
        older += 1
        assert facts.env is None, path.name
    assert older >= 20


def test_env_round_trips_through_a_snapshot(tmp_path: Path) -> None:
    facts, _ = load_snapshot(FIXTURES / "h200-1x.json")
    env = EnvFacts(os_name="Ubuntu 24.04", glibc="2.39", cpu_flags=("avx512f",), packages={"numpy": "2.1.0"},
                   variables={"NCCL_DEBUG": "WARN"}, nvcc_version="12.8")  # fmt: skip
    out = tmp_path / "box.json"
    write_snapshot(out, dump_snapshot(dataclasses.replace(facts, env=env), recorded=False))
    assert json.loads(out.read_text())["machine"]["env"]["packages"] == {"numpy": "2.1.0"}
    again, _ = load_snapshot(out)
    assert again.env == env
