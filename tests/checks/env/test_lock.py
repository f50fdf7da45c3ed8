"""Lock files: writing, reading (syntax errors with line and column), and the env-lock check on edited fixtures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from checks.env.lock import env_lock, lock_text, read_lock
from checks.errors import PreflightError
from checks.facts import EnvFacts, MachineFacts
from checks.result import Status
from checks.snapshot import load_snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machines"


def h200(packages: dict[str, str]) -> MachineFacts:
    facts, _ = load_snapshot(FIXTURES / "h200-1x.json")
    return dataclasses.replace(facts, env=EnvFacts(packages=packages))


def test_written_lock_reads_back_with_torch_index_and_header(tmp_path: Path) -> None:
    packages = {"torch": "2.9.1+cu128", "numpy": "2.1.0"}
    m = h200(packages)
    path = tmp_path / "env.lock"
    path.write_text(lock_text(m, packages, ""))
    lock = read_lock(path)
    assert [(p.name, p.version) for p in lock.pins] == [("numpy", "2.1.0"), ("torch", "2.9.1+cu128")]
    assert lock.options == ("--extra-index-url https://download.pytorch.org/whl/cu128",)
    assert lock.made_on and "NVIDIA H200 x1" in lock.made_on and "driver 580.95.05" in lock.made_on
    assert [r.status for r in env_lock(m, lock)] == [Status.OK]


def test_missing_and_different_pins_fail_with_the_command_that_fixes_them(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    path.write_text(
        "--extra-index-url https://download.pytorch.org/whl/cu128\ntorch==2.9.1+cu128\nnumpy==2.1\nrich==13.0.0\n"
    )
    results = env_lock(h200({"torch": "2.8.0+cu128", "numpy": "2.1.0"}), read_lock(path))
    by = {r.subject: r for r in results}
    assert set(by) == {"torch", "rich"}  # numpy 2.1 == 2.1.0 (PEP 440)
    assert "pip install 'torch==2.9.1+cu128' --extra-index-url https://download.pytorch.org/whl/cu128" in (
        by["torch"].hint or ""
    )
    assert "missing" in by["rich"].summary and "pip install 'rich==13.0.0'" in (by["rich"].hint or "")


def test_a_lock_torch_the_driver_cannot_run_fails(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    path.write_text("torch==2.11.0+cu130\n")
    m = h200({"torch": "2.11.0+cu130"})
    m = dataclasses.replace(m, nvml=dataclasses.replace(m.nvml, cuda_driver_version=12080))
    assert [r.subject for r in env_lock(m, read_lock(path)) if r.status is Status.FAIL] == ["torch-cuda"]


@pytest.mark.parametrize(
    ("text", "where"),
    [("numpy==1.0\ntorch=>2\n", ":2:6: Expected"), ("numpy>=1.0\n", ":1:1: 'numpy>=1.0' is not an exact pin"),
     ("--pre\n", ":1:1: unsupported option '--pre'")],
)  # fmt: skip
def test_syntax_errors_name_line_and_column(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.lock"
    path.write_text(text)
    with pytest.raises(PreflightError) as err:
        read_lock(path)
    assert f"{path}{where}" in str(err.value) and err.value.code == 2


def test_old_snapshot_skips_env_lock(tmp_path: Path) -> None:
    facts, _ = load_snapshot(FIXTURES / "h200-1x.json")
    (tmp_path / "l").write_text("numpy==2.1.0\n")
    assert [r.status for r in env_lock(facts, read_lock(tmp_path / "l"))] == [Status.SKIP]
