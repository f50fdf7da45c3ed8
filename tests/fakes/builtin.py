"""``invoke verify`` without ``--`` below the CLI with a ``--budget``, returning the report's rows and measurements
as plain values: for the time-to-verdict, docs and input tests. The planted-pipeline tests use ``fakes/planted.py``
(the same run, with what verify said, the schema check and the resume replay optional); the settings and this
host's facts (``config``, ``machine``, ``PLUGINS``, ``REPO``) are that module's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig
from checks.result import Result
from checks.verify.plan import Options
from checks.verify.run import Judged
from checks.verify.user.run import CommandRequest, verify_builtin
from tests.fakes.planted import PLUGINS, REPO, config, machine

__all__ = ["PLUGINS", "REPO", "builtin", "config", "machine"]


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
