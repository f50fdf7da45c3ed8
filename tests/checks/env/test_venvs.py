"""diff, lock and bootstrap --lock with real virtual environments: the tool run by each environment's own Python.

Three virtualenvs made here (tests/checks/env/venvs.py): ``old`` with gpf-tiny 1.0, ``new`` with gpf-tiny 2.0,
``bare`` without it; the rest of each is this Python's packages. ``invoke snapshot`` run with each one's Python
records what that environment imports; ``invoke diff`` ranks the difference; ``invoke lock`` in ``old`` and
``bootstrap --lock`` in ``new`` name the pin and the pip command of ``new``'s own Python.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.checks.env.venvs import TINY, clean_env, make_venv, tiny_project

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
CONFIG = f"""preflight:
  env: {{packages: ["{TINY}"]}}
  bench: {{enabled: false}}
  disk: {{enabled: false}}
"""


class Envs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "run.yaml"
        self.config.write_text(CONFIG)
        self.old = make_venv(root / "old", tiny_project(root / "src-1.0", "1.0"))
        self.new = make_venv(root / "new", tiny_project(root / "src-2.0", "2.0"))
        self.bare = make_venv(root / "bare")
        self._snapshots: dict[Path, Path] = {}

    def invoke(self, python: Path, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(python), "-m", "invoke", "-f", str(self.config), *args]
        return subprocess.run(argv, cwd=REPO, env=clean_env(self.root), capture_output=True, text=True, timeout=120)

    def snapshot(self, python: Path) -> Path:
        """``invoke snapshot`` run with ``python`` (once per environment: the tests read the same file)."""
        if python not in self._snapshots:
            out = self.root / f"{python.parents[1].name}.json"
            done = self.invoke(python, "snapshot", "--out", str(out))
            assert done.returncode == 0, done.stderr[-2000:]
            self._snapshots[python] = out
        return self._snapshots[python]


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Envs:
    return Envs(tmp_path_factory.mktemp("venvs"))


def test_each_environment_records_its_own_version(envs: Envs) -> None:
    for python, want in ((envs.old, "1.0"), (envs.new, "2.0"), (envs.bare, None)):
        doc = json.loads(envs.snapshot(python).read_text())
        assert doc["machine"]["env"]["python_executable"] == str(python)
        assert doc["machine"]["env"]["packages"].get(TINY) == want


def test_diff_ranks_a_newer_version_info_and_a_missing_package_break(envs: Envs) -> None:
    old, new, bare = (envs.snapshot(p) for p in (envs.old, envs.new, envs.bare))
    newer = envs.invoke(envs.old, "diff", str(old), str(new), "--json", "-")
    assert newer.returncode == 0, newer.stderr[-2000:]
    doc = json.loads(newer.stdout)
    # The two environments differ in one distribution and nothing else the snapshots hold.
    assert [(d["rank"], d["field"], d["a"], d["b"]) for d in doc["differences"]] == [
        ("info", f"package:{TINY}", "1.0", "2.0")
    ]
    assert doc["differences"][0]["reason"] == "a different version (B is newer)"
    assert doc["counts"] == {"break": 0, "slow": 0, "info": 1} and doc["not_compared"] == []
    missing = envs.invoke(envs.old, "diff", str(new), str(bare))
    assert missing.returncode == 1, missing.stderr[-2000:]
    line = next(x for x in missing.stdout.splitlines() if f"package:{TINY}" in x)
    assert line.split()[0] == "BREAK" and "2.0 -> (none): missing on B" in line
    reverse = envs.invoke(envs.old, "diff", str(bare), str(old))  # only on B: nothing A's code needs
    assert reverse.returncode == 0 and f"INFO  package:{TINY}" in reverse.stdout


def test_diff_against_live_reads_the_running_python(envs: Envs) -> None:
    old = envs.snapshot(envs.old)
    done = envs.invoke(envs.new, "diff", str(old), "live", "--json", "-")  # live: new's own interpreter
    assert done.returncode == 0, done.stderr[-2000:]
    fields = {d["field"]: (d["a"], d["b"]) for d in json.loads(done.stdout)["differences"]}
    assert fields[f"package:{TINY}"] == ("1.0", "2.0")


def test_lock_in_one_environment_fails_bootstrap_in_the_other_with_the_pip_command(envs: Envs) -> None:
    lock = envs.root / "old.lock"
    made = envs.invoke(envs.old, "lock", "--out", str(lock))
    assert made.returncode == 0 and made.stdout.startswith(f"wrote {lock}: 1 pins"), made.stderr[-2000:]
    assert [x for x in lock.read_text().splitlines() if not x.startswith("#")] == [f"{TINY}==1.0"]
    report = envs.root / "new-report.json"
    done = envs.invoke(envs.new, "bootstrap", "--lock", str(lock), "--json", str(report))
    rows = [r for r in json.loads(report.read_text())["results"] if r["id"] == "env-lock"]
    assert [(r["status"], r["subject"], r["value"], r["expected"]) for r in rows] == [("fail", TINY, "2.0", "1.0")]
    assert f"{envs.new} -m pip install '{TINY}==1.0'" in rows[0]["hint"]
    assert done.returncode == 1 and f"FAIL  env-lock[{TINY}]" in done.stdout
    same = envs.root / "old-report.json"
    envs.invoke(envs.old, "bootstrap", "--lock", str(lock), "--json", str(same))
    (row,) = [r for r in json.loads(same.read_text())["results"] if r["id"] == "env-lock"]
    assert row["status"] == "ok" and row["summary"].startswith("all 1 pins of old.lock installed")
