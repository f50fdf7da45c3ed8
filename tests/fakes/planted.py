"""``invoke verify`` without ``--`` below the CLI, for the tests that plant a bottleneck with a dataset or model of
``tests/checks/verify/planted_plugins.py`` (``--dataset``/``--model``) and assert its verdict: the tool's training
script (``templates/train.py``) run and judged on the command path (``checks.verify.user.run.verify_builtin``,
what ``tasks.verify`` calls), this host read without the torch probe, and no process left behind. (``fakes/builtin.py``
runs the same below the CLI for other tests; this one also keeps what verify said, checks the report against the
schema and can leave the resume replay out.)"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig, make_config
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.probe.host import read_host
from checks.probe.sample import process_tree
from checks.result import Result
from checks.verify.plan import Options
from checks.verify.run import Judged
from checks.verify.user.run import CommandRequest, verify_builtin
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.factories import script_module

REPO = Path(__file__).resolve().parents[2]
PLUGINS = "tests.checks.verify.planted_plugins"


def config(**verify: Any) -> PreflightConfig:
    """Small and quick: 16 px images in batches of 16, 2 warm-up steps, the sampler at 20 Hz; no re-runs for advice
    (``command_advice_s`` 0) unless a test asks for them."""
    small = {"warmup": 2, "image_size": 16, "batch_size_cpu": 16, "sample_interval_s": 0.05, "command_advice_s": 0.0}
    return make_config({"verify": small | verify})


def machine() -> MachineFacts:
    """This host without the torch probe (no GPU; the gate is not what these tests are about)."""
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())


@functools.cache
def _contents_script() -> Any:
    return script_module("ckpt_contents", REPO / "checks/probe/scripts/ckpt_contents.py")


def read_in_process(path: str, timeout: float) -> dict[str, Any]:
    """``checks.probe.torch.read_checkpoint`` without its child: the same script's ``main`` in this process, its
    answer through JSON as the child's would come (a fresh ``import torch``: seconds on this box). The child's own
    boundary (timeouts, a crash, several files in one child) is tests/checks/verify/user/test_saved.py's and
    tests/checks/probe/test_torch.py's."""
    answer: dict[str, Any] = json.loads(json.dumps(_contents_script().main(path)))
    return answer


def read_all_in_process(paths: list[str], timeout: float) -> list[dict[str, Any]]:
    """``checks.probe.torch.read_checkpoints`` without its child: ``read_in_process`` of each file."""
    return [read_in_process(path, timeout) for path in paths]


@dataclass
class Planted:
    """One judged run: its report's rows by id, its measurements, what verify said while it ran."""

    judged: Judged
    said: list[str] = field(default_factory=list)

    @property
    def m(self) -> dict[str, Any]:
        return self.judged.report.measurements

    @property
    def rows(self) -> dict[str, Result]:
        return {r.id: r for r in self.judged.report.results}


def builtin(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cfg: PreflightConfig,
    *,
    steps: int = 8,
    warmup: int = -1,
    replay: bool = True,
    **options: Any,
) -> Planted:
    """Run ``invoke verify --steps STEPS [options]`` below the CLI on this host's CPU; ``options``: the flags
    (``checks.verify.plan.Options``: ``dataset``, ``model``, ``workers``, ``nproc``, ``ckpt_dir`` ...).

    The saved checkpoint is read back in this process (``read_in_process``). ``replay=False``: for a test that
    asserts nothing of the resume, the script's first save is not kept aside (``resume.FirstSave``), so no resume
    replay runs (the script started once more: seconds of ``import torch`` on this box)."""
    from checks.verify import resume
    from checks.verify.user import run as command_run

    monkeypatch.chdir(REPO)  # --dataset/--model import paths resolve from the current folder
    monkeypatch.setattr(command_run, "read_checkpoints", read_all_in_process)
    if not replay:
        monkeypatch.setattr(resume.FirstSave, "seen", lambda self, event: None)
    json_path = str(tmp_path / "r.json")
    request = CommandRequest(cfg, (), steps=steps, warmup=warmup, json=json_path, gate=False, quiet=True, cwd=str(REPO))
    said: list[str] = []
    before = process_tree(os.getpid())  # other tests' servers may be children of this process: theirs stay
    try:
        judged = verify_builtin(request, Options(json=json_path, **options), said.append, machine)
    finally:
        assert process_tree(os.getpid()) - before == set()  # nothing the script started survives
    assert judged.report.measurements["command"]["processes_left"] == []
    doc = json.loads(json.dumps(judged.report.to_json(), default=str))  # the report as the JSON file holds it
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
    return Planted(judged, said)
