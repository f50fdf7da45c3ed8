"""``invoke bootstrap --hosts ... --install`` end to end, on real sshd hosts (network namespaces, tests/netns.py)
whose Python is Debian's /usr/bin/python3: it has pip and PyYAML but not Invoke, Fabric or numpy, like the
Python of a freshly rented box. The namespaces share this machine's filesystem, so that interpreter is theirs.

The checkout that is shipped is a copy of this one with a wheelhouse in ``wheels/`` (``hosts.wheelhouse``),
re-packed from this environment by tests/provision/wheelhouse.py (the hosts have no package index). Three runs
in order, as a user would meet them: without --install (each host fails and names the fix), with --install
(the virtualenv is made on each host and bootstrap runs with it), and with --install again (already there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provision.ship import EXCLUDES
from provision.venv import STAMP, VENV, requirements
from tests.netns import Cluster, NsHost, cluster, controller_env, unavailable
from tests.provision.wheelhouse import build

BOX_PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]


def fresh_box() -> str | None:
    """Why Debian's Python cannot stand in for a fresh box here, or None."""
    if not Path(BOX_PYTHON).exists():
        return f"needs a system Python at {BOX_PYTHON}"
    if subprocess.run([BOX_PYTHON, "-m", "pip", "--version"], capture_output=True).returncode:
        return "the system Python has no pip (apt-get install python3-pip)"
    if not subprocess.run([BOX_PYTHON, "-c", "import invoke"], capture_output=True).returncode:
        return "the system Python already has invoke: not a fresh box"
    version = subprocess.run([BOX_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
    if version.stdout.decode().strip() != str(sys.version_info[:2]):
        return "the wheels re-packed from this environment need the system Python's minor version"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
    pytest.mark.skipif(fresh_box() is not None, reason=str(fresh_box())),
]
# The links are asserted only to have run (with the venv's Python): the built-in agent for 0.4 s each way, not iperf3's
# whole seconds.
CONFIG = f"""preflight:
  bench: {{enabled: false}}
  disk: {{enabled: false}}
  network: {{link_seconds: 0.3, link_omit_s: 0.1, use_iperf3: false, allreduce_max_mib: 4, allreduce_budget_s: 2.0}}
  hosts: {{python: {BOX_PYTHON}, wheelhouse: wheels, connect_timeout_s: 5.0, dead_after_s: 5.0,
          run_timeout_s: 180.0}}
"""


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Every dependency of pyproject.toml and theirs as wheels, built once per session (0.6-0.9 s, 156 MB)."""
    folder = tmp_path_factory.mktemp("wheelhouse") / "wheels"
    start = time.monotonic()
    build(requirements(REPO), folder)
    return folder, time.monotonic() - start


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    doc: dict[str, Any]
    seconds: float
    venvs: list[bool]  # after the run: whether each host has <checkout>/.venv

    def host(self, name: str) -> dict[str, Any]:
        return next(h for h in self.doc["hosts"] if h["host"] == name)

    def row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.doc["results"] if r["host"] == name and r["id"] == "host-bootstrap")


@dataclass
class Fleet:
    cluster: Cluster
    checkout: Path
    home: Path
    runs: dict[str, Run]

    def venv(self, host: NsHost) -> Path:
        return host.home / ".cache" / "gpu-preflight" / "checkout" / VENV


def _copy_checkout(target: Path, wheels: Path) -> None:
    """This checkout as a user's would be (what rsync ships, plus tasks.py's neighbours), wheels/ inside."""
    anywhere = shutil.ignore_patterns(*(e for e in EXCLUDES if not e.startswith("/")))
    top = {e.lstrip("/") for e in EXCLUDES if e.startswith("/")}  # "/reports": the checkout's own, not checks/reports

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(anywhere(folder, names)) | ({n for n in names if n in top} if Path(folder) == REPO else set())

    shutil.copytree(REPO, target, ignore=ignore)
    shutil.copytree(wheels, target / "wheels", copy_function=os.link)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, wheelhouse: tuple[Path, float]) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("install")
    checkout, home = root / "gpu-preflight", root / "controller"
    _copy_checkout(checkout, wheelhouse[0])
    (home / ".ssh").mkdir(parents=True)
    (home / "run.yaml").write_text(CONFIG)
    env = controller_env(home)
    with cluster(root / "hosts", [None, None]) as built:
        (home / ".ssh" / "config").write_text(built.ssh_config())

        def run(*flags: str) -> Run:
            argv = [sys.executable, "-m", "invoke", "-f", str(home / "run.yaml"), "bootstrap", "--hosts", "h1,h2"]
            start = time.monotonic()
            proc = subprocess.run(
                [*argv, *flags, "--json", "-"], cwd=checkout, env=env, capture_output=True, text=True, timeout=400
            )
            seconds = time.monotonic() - start
            assert proc.stdout.startswith("{"), proc.stderr[-3000:]
            venvs = [(h.home / ".cache" / "gpu-preflight" / "checkout" / VENV).exists() for h in built.hosts]
            return Run(proc, json.loads(proc.stdout), seconds, venvs)

        runs = {"without": run(), "first": run("--install"), "again": run("--install")}
        yield Fleet(built, checkout, home, runs)


def test_without_install_each_host_fails_naming_the_dependencies_and_install(fleet: Fleet) -> None:
    done = fleet.runs["without"]
    assert done.proc.returncode == 1 and "Traceback" not in done.proc.stderr
    for name in ("h1", "h2"):
        host = done.host(name)
        assert host["status"] == "fail", host
        assert "lacks gpu-preflight's dependencies (No module named 'invoke')" in host["reason"], host
        assert "bootstrap with --install" in host["reason"] and f"{BOX_PYTHON} -m pip install ." in host["reason"]
        assert host["installed"] is None
    assert done.venvs == [False, False]
    assert "hint: bootstrap --hosts with --install" in done.proc.stderr


def test_first_install_makes_the_venv_on_each_host_and_bootstrap_runs_with_it(fleet: Fleet) -> None:
    done = fleet.runs["first"]
    assert "Traceback" not in done.proc.stderr
    for host in fleet.cluster.hosts:
        assert done.host(host.name)["status"] == "ok", (done.host(host.name), done.proc.stderr[-3000:])
        summary, venv = done.row(host.name)["summary"], fleet.venv(host)
        installed = done.host(host.name)["installed"]
        head, how, names = _parts(installed)
        assert summary.endswith(f"; {installed}") and head == f"installed {len(names)} distributions into {venv}"
        assert {"invoke", "fabric", "numpy", "matplotlib", "paramiko", "nvidia-ml-py"} <= set(names), names
        # the box's own PyYAML and cryptography were kept, not installed again into the venv
        assert how.startswith("with the box's pip, --no-index from wheels; kept the box's cryptography 38"), how
        assert "pyyaml 6" in how and not {"pyyaml", "cryptography"} & set(names)
        assert _note(done.proc.stderr, host.name) == head
        assert f"gpu-preflight: {host.name}: {head}; bootstrap done in" in done.proc.stderr
        assert (venv / STAMP).is_file() and not (venv / "bin" / "pip").exists()
        probe = "import sys, invoke, numpy, yaml; print(sys.prefix, numpy.__file__, yaml.__file__)"
        prefix, numpy_at, yaml_at = subprocess.run(
            [venv / "bin" / "python", "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
        assert prefix == str(venv) and numpy_at.startswith(str(venv)) and yaml_at.startswith("/usr/lib/python3/")
        own = [r for r in done.doc["results"] if r["host"] == host.name]
        assert {"driver", "cpu-cores", "alloc-conf"} <= {r["id"] for r in own}  # bootstrap's own rows came back
    links = done.doc["measurements"]["links"]  # the link agents ran with the venv's Python too
    assert len(links) == 2 and all(x["error"] is None and x["tcp_mbit_s"] > 0 for x in links), links


def test_second_install_finds_the_dependencies_there_and_installs_nothing(fleet: Fleet) -> None:
    done = fleet.runs["again"]
    for host in fleet.cluster.hosts:
        assert done.host(host.name)["status"] == "ok", done.host(host.name)
        summary, installed = done.row(host.name)["summary"], done.host(host.name)["installed"]
        assert installed == f"dependencies already in {fleet.venv(host)}" and summary.endswith(f"; {installed}")
        assert _note(done.proc.stderr, host.name) == installed
    first, again = fleet.runs["first"], fleet.runs["again"]
    gain = [first.host(n)["seconds"] - again.host(n)["seconds"] for n in ("h1", "h2")]
    print(f"install: {gain} s per host more than the ready run; whole runs {first.seconds:.1f} / {again.seconds:.1f} s")
    assert all(g > 1.0 for g in gain), gain  # the install's time is gone from the second run


def _parts(installed: str) -> tuple[str, str, list[str]]:
    """Split "installed N distributions into VENV (HOW): a-1 b-2" into its head, how, and the names."""
    head, _, rest = installed.partition(" (")
    how, _, listed = rest.rpartition("): ")
    return head, how, [name.rsplit("-", 1)[0].lower().replace("_", "-") for name in listed.split()]


def _note(text: str, host: str) -> str:
    """The note of ``host``'s line in the text report's hosts table."""
    row = next(line.split() for line in text.splitlines() if line.split()[:2] == [host, "ok"])
    return " ".join(row[9:])


def test_the_hosts_keep_no_temporary_files(fleet: Fleet) -> None:
    for host in fleet.cluster.hosts:
        assert list((host.root / "tmp").iterdir()) == [], host.name
