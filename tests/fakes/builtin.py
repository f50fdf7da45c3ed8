"""``invoke verify`` without ``--`` below the CLI: the tool's script (``templates/train.py``) run and judged as a
command, for the tests that plant a bottleneck with a dataset or model of ``tests/checks/verify/smoke_plugins.py``
and assert what the report says."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig, make_config
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.probe.host import read_host
from checks.result import Result
from checks.verify.plan import Options
from checks.verify.run import Judged
from checks.verify.user.run import CommandRequest, verify_builtin

REPO = Path(__file__).resolve().parents[2]
PLUGINS = "tests.checks.verify.smoke_plugins"


def config(**verify: Any) -> PreflightConfig:
    """Small runs: a few steps of 16 images of 16 px, no re-runs for advice unless a test asks for them."""
    cfg = make_config()
    small: dict[str, Any] = {"steps": 12, "warmup": 2, "image_size": 16, "batch_size_cpu": 16}
    small |= {"sample_interval_s": 0.05, "command_advice_s": 0.0} | verify
    return dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, **small))


def machine() -> MachineFacts:
    """This host without the torch probe (the gate is not what these tests are about)."""
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())


def builtin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: PreflightConfig, budget: str = "", **options: Any
) -> tuple[Judged, dict[str, Result], dict[str, Any]]:
    """Run ``invoke verify`` (no ``--``) below the CLI, ``budget`` as ``--budget``; return what it judged, its
    results by id and the report's measurements."""
    monkeypatch.chdir(REPO)  # --dataset/--model import paths resolve from the current directory
    opts = Options(json=str(tmp_path / "r.json"), **options)
    request = CommandRequest(cfg, (), json=opts.json, gate=False, quiet=True, budget=budget)
    judged = verify_builtin(request, opts, lambda line: None, machine)
    return judged, {r.id: r for r in judged.report.results}, judged.report.measurements
