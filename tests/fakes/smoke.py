"""verify's real pipeline below the CLI (plan -> child process under the sampler -> judge), for the tests that
plant a bottleneck with a dataset or model of ``tests/checks/verify/smoke_plugins.py`` and assert its verdict."""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig, make_config
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.probe.host import read_host
from checks.reports.verify import Checkpoint
from checks.result import Result
from checks.verify.plan import Options, Outcome, plan, run
from checks.verify.report import judge

REPO = Path(__file__).resolve().parents[2]
PLUGINS = "tests.checks.verify.smoke_plugins"


def config(**verify: Any) -> PreflightConfig:
    cfg = make_config()
    small = {"steps": 12, "warmup": 2, "image_size": 16, "batch_size_cpu": 16, "sample_interval_s": 0.05} | verify
    return dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, **small))


def machine() -> MachineFacts:
    """This host without the torch probe (the gate is not what these tests are about)."""
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())


def smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: PreflightConfig, **options: Any
) -> tuple[Outcome, dict[str, Result], dict[str, Any]]:
    """Run verify below the CLI; return the outcome, results by id and measurements."""
    monkeypatch.chdir(REPO)  # --dataset/--model import paths resolve from the current directory
    opts = Options(json=str(tmp_path / "r.json"), **options)
    with ExitStack() as stack:
        p, _ = plan(opts, cfg, machine, stack)
        outcome = run(p, cfg, lambda e: None)
        results, measurements, _ = judge(p, outcome, cfg.verify)
    return outcome, {r.id: r for r in results}, measurements.to_json()


def checkpoint(outcome: Outcome) -> Checkpoint:
    """The child's checkpoint round trip (the test fails when there is none)."""
    assert outcome.child.result is not None and outcome.child.result.checkpoint is not None, outcome.child.log_tail
    return outcome.child.result.checkpoint
