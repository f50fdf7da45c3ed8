"""Drift between real hosts: namespace hosts with sshd (tests/netns.py) whose Pythons differ, and --lock on them.

Four hosts, each running bootstrap with a virtualenv of its own Python (a hosts file's ``python=``, as a user
points each host at its training environment): h1 and h2 with gpf-tiny 1.0, h3 with gpf-tiny 2.0, h4 with
gpf-tiny 1.0 and no torch (tests/checks/env/venvs.py). The fleet report must show the drift table and apply the
rule: torch off the majority fails, another package warns. ``--lock`` made in h1's environment is sent to every
host: h3's env-lock fails naming the pin and h3's own pip command.

gpf-tiny goes into the virtualenvs as a wheel written here (pip installs it as it would any wheel); building the
project with setuptools for each virtualenv cost 2.4 s of the 2.6 s each took. The four are made side by side.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.checks.env.venvs import TINY, clean_env, make_venv
from tests.netns import cluster, python_for_hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REPO = Path(__file__).resolve().parents[3]
CONFIG = """preflight:
  bench: {{enabled: false}}
  disk: {{enabled: false}}
  network: {{links: false, allreduce: false}}
  env: {{packages: ["{tiny}"]}}
  hosts: {{python: {python}, connect_timeout_s: 5.0, dead_after_s: 10.0, run_timeout_s: 120.0}}
"""


class Fleet:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "controller"
        self.config = root / "run.yaml"
        self.config.write_text(CONFIG.format(tiny=TINY, python=python_for_hosts()))
        one, two = tiny_wheel(root / "wheels", "1.0"), tiny_wheel(root / "wheels", "2.0")
        wanted = {"h1": (one, True), "h2": (one, True), "h3": (two, True), "h4": (one, False)}
        with ThreadPoolExecutor(2) as pool:
            made = {h: pool.submit(make_venv, root / f"{h}-env", w, torch=t) for h, (w, t) in wanted.items()}
        self.pythons = {h: future.result() for h, future in made.items()}

    def invoke(self, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
        argv = [python, "-m", "invoke", "-f", str(self.config), *args]
        return subprocess.run(argv, cwd=REPO, env=clean_env(self.home), capture_output=True, text=True, timeout=240)


def tiny_wheel(folder: Path, version: str) -> Path:
    """gpf-tiny at ``version`` as a wheel in ``folder`` (the one module of tests/checks/env/venvs.py's project)."""
    info = f"gpf_tiny-{version}.dist-info"
    files = {
        "gpf_tiny/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {TINY}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gpf_tiny-{version}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(text.encode())}\n")
        whl.writestr(f"{info}/RECORD", "".join([*rows, f"{info}/RECORD,,\n"]))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("drift")
    built = Fleet(root)
    with cluster(root / "hosts", [None] * 4) as hosts:
        (built.home / ".ssh").mkdir(parents=True)
        (built.home / ".ssh" / "config").write_text(hosts.ssh_config())
        yield built


@pytest.fixture(scope="module")
def run(fleet: Fleet) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    lock = fleet.root / "h1.lock"
    made = fleet.invoke("lock", "--out", str(lock), python=str(fleet.pythons["h1"]))
    assert made.returncode == 0, made.stderr[-2000:]
    hostfile = fleet.root / "hostfile"
    hostfile.write_text("".join(f"{name} python={python}\n" for name, python in fleet.pythons.items()))
    proc = fleet.invoke("bootstrap", "--hosts-file", str(hostfile), "--lock", str(lock), "--json", "-")
    return proc, json.loads(proc.stdout or "{}")


def test_every_host_ran_with_its_own_python(run: Any, fleet: Fleet) -> None:
    proc, doc = run
    assert [(h["host"], h["status"]) for h in doc["hosts"]] == [(f"h{i}", "ok") for i in range(1, 5)], proc.stderr
    torch = {r["host"]: r["status"] for r in doc["results"] if r["id"] == "torch-build"}
    assert torch == {"h1": "ok", "h2": "ok", "h3": "ok", "h4": "fail"}  # h4's environment has no torch


def test_torch_off_the_majority_fails_and_a_package_warns(run: Any) -> None:
    proc, doc = run
    drift = {(r["host"], r["subject"]): (r["status"], r["value"], r["expected"]) for r in doc["results"]
             if r["id"] == "fleet-drift"}  # fmt: skip
    assert drift == {
        ("h4", "torch"): ("fail", None, doc_torch(doc)),
        ("h3", TINY): ("warn", "2.0", "1.0"),
    }
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def test_the_drift_table_shows_the_columns_that_differ(run: Any) -> None:
    proc, doc = run
    lines = proc.stderr.splitlines()
    start = lines.index("environment drift (the columns that differ)")
    head, *rows = (line.split() for line in lines[start + 1 : start + 6])
    assert head == ["host", "torch", TINY]
    torch = doc_torch(doc)
    assert [r for r in rows if r[0].startswith("h")] == [
        ["h1", torch, "1.0"], ["h2", torch, "1.0"], ["h3", torch, "2.0"], ["h4", "-", "1.0"]
    ]  # fmt: skip


def test_the_lock_is_checked_on_every_host(run: Any, fleet: Fleet) -> None:
    _, doc = run
    rows = {r["host"]: r for r in doc["results"] if r["id"] == "env-lock"}
    assert {h: r["status"] for h, r in rows.items()} == {"h1": "ok", "h2": "ok", "h3": "fail", "h4": "ok"}
    assert rows["h3"]["subject"] == TINY and rows["h3"]["summary"].startswith(
        f"{TINY}: 2.0 installed, the lock pins 1.0"
    )
    assert f"{fleet.pythons['h3']} -m pip install '{TINY}==1.0'" in rows["h3"]["hint"]


def test_a_bad_lock_stops_before_any_host_is_reached(fleet: Fleet) -> None:
    bad = fleet.root / "bad.lock"
    bad.write_text(f"{TINY}==1.0\nnumpy>=1\n")
    proc = fleet.invoke("bootstrap", "--hosts", "h1,h2", "--lock", str(bad))
    assert proc.returncode == 2 and f"{bad}:2:1: 'numpy>=1' is not an exact pin" in proc.stderr
    assert "h1:" not in proc.stderr  # no host progress line: nothing was started


def doc_torch(doc: dict[str, Any]) -> str:
    """The torch the hosts with torch run: this Python's, which their virtualenvs share."""
    import torch

    return str(torch.__version__)
