"""The process a user starts for bootstrap, verify, stage-data and watch never imports torch.

torch is imported only in child processes (the torch probe, verify's training child), so a broken CUDA install
can hang or crash a child, never the tool, and the tool starts in a fraction of torch's import time. Each test
runs ``python -m invoke TASK ...`` as a user would, through a ``-c`` wrapper that puts a finder for ``torch`` first
on the parent's ``sys.meta_path``: any attempt to import it is recorded and raises ImportError. Only that one
interpreter is affected: the children the task starts are fresh interpreters (subprocesses, a fork server) that
import torch as usual, so verify still trains. At the end the wrapper writes the exit code, the attempts and the
``torch*`` modules loaded; the test wants the task's normal exit code, no attempt and no module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each test starts the tool (and verify its children) as a real process

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "machines"
_INHERITED = re.compile(r"^(INVOKE_PREFLIGHT_|PYTORCH_\w*ALLOC_CONF$)")

WRAPPER = textwrap.dedent(
    """
    import importlib.abc, json, runpy, sys

    attempts = []

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                attempts.append(name)
                raise ImportError(f"torch is blocked in the parent process: {name}")
            return None

    sys.meta_path.insert(0, NoTorch())
    result_file = sys.argv.pop(1)
    sys.argv[0] = "invoke"
    code, error = 0, None
    try:
        runpy.run_module("invoke", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # a traceback: the task itself broke
        code, error = 1, repr(exc)
    loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    with open(result_file, "w") as f:
        json.dump({"code": code, "error": error, "attempts": attempts, "loaded": loaded}, f)
    """
)

# A model for verify's child that costs next to nothing per step, so the test times the tool, not training.
PLUGIN = textwrap.dedent(
    """
    def tiny():
        import torch

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8 * 8 * 3, 10)

            def forward(self, x):
                return self.fc(x.flatten(1).float() / 255)

        return Tiny()
    """
)


def run_parent(
    tmp_path: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> dict[str, Any]:
    """``python -m invoke ARGS`` with torch blocked in that process only; its result, stdout and stderr."""
    home, result = tmp_path / "home", tmp_path / "parent.json"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not _INHERITED.match(k)}
    clean |= {"HOME": str(home), "NO_COLOR": "1", **(env or {})}
    argv = [sys.executable, "-c", WRAPPER, str(result), "--search-root", str(REPO), *args]
    proc = subprocess.run(argv, cwd=cwd or REPO, env=clean, capture_output=True, text=True, timeout=timeout)
    assert result.is_file(), f"the wrapper wrote nothing (exit {proc.returncode})\n{proc.stderr[-3000:]}"
    return json.loads(result.read_text()) | {"out": proc.stdout, "err": proc.stderr}


def assert_no_torch(got: dict[str, Any], code: int = 0) -> None:
    why = f"exit {got['code']}\n--- stdout\n{got['out'][-2000:]}\n--- stderr\n{got['err'][-2000:]}"
    assert got["attempts"] == [], why
    assert got["loaded"] == [], why
    assert got["error"] is None and got["code"] == code, why


def test_the_blocker_sees_an_import_of_torch(tmp_path: Path) -> None:
    """The wrapper itself: a task that imports torch in the parent is caught (here: a tasks file of its own)."""
    (tmp_path / "tasks.py").write_text("from invoke import task\n\n@task\ndef boom(c):\n    import torch\n")
    home, result = tmp_path / "home", tmp_path / "parent.json"
    home.mkdir()
    argv = [sys.executable, "-c", WRAPPER, str(result), "--search-root", str(tmp_path), "boom"]
    subprocess.run(argv, cwd=tmp_path, env=os.environ | {"HOME": str(home)}, capture_output=True, timeout=120)
    got = json.loads(result.read_text())
    assert got["attempts"] == ["torch"] and got["loaded"] == [] and got["code"] == 1, got
    assert "torch is blocked in the parent process" in got["error"], got


def test_bootstrap_replaying_a_gpu_machine_imports_no_torch(tmp_path: Path) -> None:
    got = run_parent(tmp_path, "bootstrap", "--machine", str(FIXTURES / "h200-1x.json"))
    assert_no_torch(got)
    assert "NVIDIA H200" in got["out"], got["out"][-2000:]


def test_stage_data_imports_no_torch(tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "photos"
    for label, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        (src / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (48 + 8 * i, 40), colour).save(src / label / f"{i}.jpg", quality=90)
    dest = tmp_path / "staged"
    got = run_parent(
        tmp_path, "stage-data", "--source", str(src), "--dest", str(dest), "--size", "16", "--workers", "1"
    )
    assert_no_torch(got)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["counts"]["staged"] == 6, manifest["counts"]


def test_watch_imports_no_torch(tmp_path: Path) -> None:
    report = tmp_path / "watch.json"
    got = run_parent(tmp_path, "watch", "--seconds", "1", "--json", str(report))
    assert_no_torch(got)
    assert json.loads(report.read_text())["tool"], got["out"][-2000:]


def test_verify_parent_imports_no_torch_while_its_child_trains(tmp_path: Path) -> None:
    """verify's parent plans, runs bootstrap's checks (their torch probe is a child), samples and judges; the
    training child imports torch and trains the tiny model (a model loaded from the current directory)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tinyplugin.py").write_text(PLUGIN)
    report = tmp_path / "verify.json"
    knobs = {"WARMUP": "1", "IMAGE_SIZE": "8", "RESUME_STEPS": "1", "COMMAND_ADVICE_S": "0", "LOSS_MUST_DECREASE": "0"}
    env = {f"INVOKE_PREFLIGHT_VERIFY_{k}": v for k, v in knobs.items()}
    args = ("verify", "--steps", "2", "--batch-size", "4", "--workers", "0", "--device", "cpu")
    got = run_parent(tmp_path, *args, "--model", "tinyplugin:tiny", "--json", str(report), cwd=work, env=env)
    assert_no_torch(got)
    doc = json.loads(report.read_text())
    results = {r["id"]: r["status"] for r in doc["results"]}
    assert results["verify-loop"] == "ok", results  # the child trained: torch was importable there
    assert doc["measurements"]["run"]["torch"], doc["measurements"]["run"]
