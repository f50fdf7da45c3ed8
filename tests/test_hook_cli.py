"""``invoke bootstrap --hook`` in-process: exit 0 healthy, 1 with one reason line on stderr, nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.cli import assert_usage_error, in_process

MACHINES = Path(__file__).resolve().parent / "fixtures" / "machines"


def test_hook_healthy_and_unhealthy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = in_process(monkeypatch, capsys)
    healthy = run(tmp_path, "bootstrap", "--hook", "--machine", str(MACHINES / "h100-sxm-8x-healthy.json"))
    assert (healthy.code, healthy.out, healthy.err) == (0, "", ""), healthy.why()
    broken = run(
        tmp_path, "bootstrap", "--hook", "--machine", str(MACHINES / "gpu-lost.json"), SLURMD_NODENAME="gpu-017"
    )
    assert (broken.code, broken.out) == (1, ""), broken.why()
    assert broken.err.splitlines() == ["gpu-preflight: gpu-inventory gpu1 NVIDIA H100 80GB HBM3: GPU is lost"]


def test_drain_without_hook_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = in_process(monkeypatch, capsys)
    assert_usage_error(run(tmp_path, "bootstrap", "--drain"), "--drain needs --hook")
    assert_usage_error(run(tmp_path, "bootstrap", "--hook", "--hosts", "a,b"), "this node only")
