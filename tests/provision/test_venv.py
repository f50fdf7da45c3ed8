"""The install step's script run for real: the box's own Python (Debian's /usr/bin/python3, which lacks the
tool's dependencies, like a freshly rented box) makes the virtualenv, the box's pip installs from a wheelhouse
with --no-index, and a second run does nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provision.venv import STAMP, VENV, install_script, requirements
from tests.provision.wheelhouse import repack

pytestmark = pytest.mark.slow
BOX_PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]


def box_has_pip() -> str | None:
    if not Path(BOX_PYTHON).exists():
        return f"needs a system Python at {BOX_PYTHON}"
    if subprocess.run([BOX_PYTHON, "-m", "pip", "--version"], capture_output=True).returncode:
        return "the system Python has no pip (apt-get install python3-pip)"
    if not subprocess.run([BOX_PYTHON, "-c", "import sh, tqdm"], capture_output=True).returncode:
        return "the system Python already has sh and tqdm: nothing to install"
    return None


def run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.skipif(box_has_pip() is not None, reason=str(box_has_pip()))
def test_venv_keeps_the_box_packages_installs_from_the_wheelhouse_and_is_idempotent(tmp_path: Path) -> None:
    checkout = tmp_path / "gpu-preflight"
    (checkout / "wheels").mkdir(parents=True)
    for name in ("sh", "tqdm"):
        repack(name, checkout / "wheels")
    script = install_script(str(checkout), BOX_PYTHON, ("sh>=2.0", "tqdm>=4.60"), "wheels")
    first = run(script, tmp_path)
    assert first.returncode == 0 and first.stdout.split()[-1] == "installed", first.stderr
    assert "Successfully installed sh-" in first.stderr and "tqdm-" in first.stderr
    py = checkout / VENV / "bin" / "python"
    probe = "import sh, tqdm, yaml, sys; print(sys.prefix, yaml.__file__)"  # yaml: the box's own package
    prefix, yaml_at = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert prefix == str(checkout / VENV) and yaml_at.startswith("/usr/lib/python3")
    assert not (checkout / VENV / "bin" / "pip").exists()  # made --without-pip: the box's pip did the work
    again = run(script, tmp_path)
    assert again.returncode == 0 and again.stdout.split() == ["ready"] and again.stderr == ""
    (checkout / VENV / STAMP).unlink()  # a changed list (no stamp): pip runs again, finds everything there
    third = run(script, tmp_path)
    assert third.returncode == 0 and "Requirement already satisfied: sh" in third.stderr


@pytest.mark.skipif(box_has_pip() is not None, reason=str(box_has_pip()))
def test_a_host_python_that_is_a_virtualenv_keeps_its_own_packages_not_only_its_base_installs(tmp_path: Path) -> None:
    training = tmp_path / "training"  # the user's training environment: a virtualenv that keeps the box's packages
    made = [BOX_PYTHON, "-m", "venv", "--without-pip", "--system-site-packages", str(training)]
    subprocess.run(made, check=True, timeout=60)
    site = subprocess.run(
        [training / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "gpf_training_only.py").write_text("WHERE = 'training'\n")  # in the virtualenv, not its base
    checkout = tmp_path / "gpu-preflight"
    (checkout / "wheels").mkdir(parents=True)
    repack("sh", checkout / "wheels")
    done = run(install_script(str(checkout), str(training / "bin" / "python"), ("sh>=2.0",), "wheels"), tmp_path)
    assert done.returncode == 0 and done.stdout.split()[-1] == "installed", done.stderr
    probe = "import gpf_training_only, sh, yaml, sys; print(sys.prefix, gpf_training_only.WHERE, yaml.__file__)"
    py = checkout / VENV / "bin" / "python"
    prefix, where, yaml_at = subprocess.run(
        [py, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert prefix == str(checkout / VENV) and where == "training" and yaml_at.startswith("/usr/lib/python3")


@pytest.mark.skipif(box_has_pip() is not None, reason=str(box_has_pip()))
def test_a_wheelhouse_that_lacks_a_dependency_fails_with_pips_reason(tmp_path: Path) -> None:
    checkout = tmp_path / "c"
    (checkout / "wheels").mkdir(parents=True)
    done = run(install_script(str(checkout), BOX_PYTHON, ("tqdm>=4.60",), "wheels"), tmp_path)
    assert done.returncode == 8 and done.stdout.split()[-1] == "pipfailed"
    assert "No matching distribution found for tqdm" in done.stderr
    assert not (checkout / VENV / STAMP).exists()


def test_the_requirements_are_the_checkouts_and_never_torch() -> None:
    reqs = requirements(REPO)
    assert any(r.startswith("invoke") for r in reqs) and any(r.startswith("fabric") for r in reqs)
    assert not any(r.split("[")[0].split(">")[0].split("=")[0].strip() == "torch" for r in reqs)


def test_no_venv_module_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "python-without-venv"
    fake.write_text("#!/bin/sh\necho 'No module named venv' >&2; exit 1\n")
    fake.chmod(0o755)
    done = run(install_script(str(tmp_path), str(fake), ("x",)), tmp_path)
    assert done.returncode == 6 and done.stdout.split() == ["novenv"]
