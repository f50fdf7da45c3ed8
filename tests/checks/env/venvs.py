"""Real virtual environments for the environment tests, made offline.

``gpf-tiny`` is a one-module project written by the test (a minimal pyproject, setuptools backend) and installed
with ``pip install --no-index --no-build-isolation`` into each virtualenv, so two environments differ in exactly
one real distribution. The virtualenvs see this Python's packages (invoke, torch, ...) and so run the tool from the
checkout like a user's training environment would: they are made by ``provision.venv.MAKE_VENV``, the step
``--install`` takes on a host (``--system-site-packages``; where this Python is itself a virtualenv, the README's
test command run in one, its site directories through a .pth file, since ``--system-site-packages`` would show its
base install instead: no Invoke, an old setuptools). ``without torch`` is a virtualenv of its own whose
site-packages links every top-level entry of this Python's site directories except torch's files: the same
packages, torch not installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import site
import subprocess
import sys
from pathlib import Path

from provision.venv import MAKE_VENV

TINY = "gpf-tiny"


def tiny_project(folder: Path, version: str) -> Path:
    """Write the gpf-tiny project at ``version`` into ``folder``; return it."""
    (folder / "gpf_tiny").mkdir(parents=True)
    (folder / "gpf_tiny" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{TINY}"\nversion = "{version}"\n\n[tool.setuptools]\npackages = ["gpf_tiny"]\n'
    )
    return folder


def make_venv(path: Path, tiny: Path | None = None, *, torch: bool = True) -> Path:
    """A virtualenv at ``path`` (gpf-tiny built from ``tiny`` installed into it); return its python."""
    python = path / "bin" / "python"
    if torch:
        subprocess.run([sys.executable, "-c", MAKE_VENV, str(path)], check=True, timeout=60)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
        target = _site_packages(python)
        for source in site.getsitepackages():  # this virtualenv's first, then its base's where it sees them
            if Path(source).is_dir():
                _link_all_but_torch(Path(source), target)
    if tiny is not None:
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-build-isolation"]
        subprocess.run([*pip, "--no-deps", "-q", str(tiny)], check=True, timeout=120, capture_output=True)
    return python


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return Path(out.stdout.strip())


def _link_all_but_torch(source: Path, target: Path) -> None:
    torch = importlib.metadata.distribution("torch")
    skip = {Path(str(f)).parts[0] for f in torch.files or [] if not str(f).startswith("..")}
    for entry in source.iterdir():
        if entry.name not in skip and not (target / entry.name).exists():
            os.symlink(entry, target / entry.name)


def clean_env(home: Path) -> dict[str, str]:
    """This process's environment without the run's own settings, HOME moved to ``home``, no colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_PREFLIGHT_", "SLURM_"))}
    env.update(HOME=str(home), NO_COLOR="1")
    return env
