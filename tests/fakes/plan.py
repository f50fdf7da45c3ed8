"""``invoke plan`` in this process, over the models of tests/checks/plan/plan_models.py (imported from that folder,
as a user's own module would be), with the replayed CPU machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakes.cli import Here, Run

MODELS = Path(__file__).resolve().parents[1] / "checks" / "plan"
NO_GPU = str(Path(__file__).resolve().parents[1] / "fixtures" / "machines" / "cpu-only-no-driver.json")
SEVEN_B = ("--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "2048", "--vocab", "32000")


def plan(here: Here, tmp: Path, *args: str, config: dict[str, Any] | None = None) -> tuple[Run, dict[str, Any]]:
    extra: list[str] = []
    if config is not None:
        (tmp / "cfg.yaml").write_text(json.dumps({"preflight": {"plan": config}}))
        extra = ["-f", str(tmp / "cfg.yaml")]
    out = tmp / "plan.json"
    run = here(tmp, *extra, "plan", "--machine", NO_GPU, *args, "--json", str(out))
    return run, json.loads(out.read_text()) if out.exists() else {}
