"""``bootstrap --hosts ... --install`` (``hosts.install``): a virtualenv next to the remote checkout, with its
dependencies, made with the host's own Python and pip.

The virtualenv is ``<checkout>/.venv`` (rsync's exclude list and the tar path both leave it in place), made to see
the host Python's packages, so the box's own torch, built for its driver, stays the one that is imported: created
``--system-site-packages``, or, where ``hosts.python`` is itself a virtualenv (a training environment made with
``python -m venv``), given that virtualenv's site directories by a ``.pth`` file (``MAKE_VENV``). It is made
``--without-pip``: the box's pip (seen through those directories) installs into it, and ``ensurepip`` is the
fallback only where the box has no pip. The install is idempotent: a stamp in the virtualenv holds the hash of
what was asked for, and a second run with the same list does nothing. With ``hosts.wheelhouse`` (a folder of the
checkout, shipped with it) pip installs ``--no-index --find-links`` from it: for boxes without a package index.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from provision.remote import RemoteError, Session

VENV = ".venv"
STAMP = ".gpu-preflight-deps"
INSTALL_TIMEOUT_S = 900.0
# Run by the host's Python with the new virtualenv's path: make it (--without-pip) so that it sees what that Python
# sees. A Python that is itself a virtualenv would show a --system-site-packages one its *base* install's packages,
# not its own (docs/sources.md#venv-system-site): the new one then gets that Python's site directories instead, in
# its sys.path order, through a .pth file (site.addsitedir, so their own .pth files run too).
MAKE_VENV = """
import site, subprocess, sys, venv
target, outer = sys.argv[1], sys.prefix != sys.base_prefix
venv.EnvBuilder(system_site_packages=not outer, symlinks=True).create(target)
if outer:
    sites = {*site.getsitepackages(), site.getusersitepackages()}
    lines = [f"import site; site.addsitedir({p!r})\\n" for p in sys.path if p in sites]
    ask = [target + "/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    purelib = subprocess.run(ask, capture_output=True, text=True, check=True).stdout.strip()
    open(purelib + "/gpu-preflight-outer-site.pth", "w").write("".join(lines))
"""


@dataclass(frozen=True)
class Installed:
    """Where the dependencies are and what this run put there."""

    python: str  # absolute path of the virtualenv's Python
    summary: str  # one line for the report: "<what was done, where>[ (<how>[: <name-version ...>])]"


def install_note(summary: str) -> str:
    """The short head of an ``Installed.summary``, what and where without how and the list (a table's note)."""
    return summary.split(" (", 1)[0]


def install_script(directory: str, python: str, requirements: tuple[str, ...], wheelhouse: str = "") -> str:
    """Write the POSIX script that makes the virtualenv and installs ``requirements`` with the box's pip."""
    d, v = shlex.quote(directory), shlex.quote(f"{directory}/{VENV}")
    stamp = hashlib.sha256("\n".join((*requirements, wheelhouse)).encode()).hexdigest()[:16]
    source = f"--no-index --find-links {shlex.quote(f'{directory}/{wheelhouse}')} " if wheelhouse else ""
    pip = f"{v}/bin/python -m pip install --disable-pip-version-check --no-input --progress-bar off {source}"
    return "; ".join(
        [
            f"cd {d} || exit 5",
            f'if [ "$(cat {v}/{STAMP} 2>/dev/null)" = {stamp} ] && [ -x {v}/bin/python ]; then echo ready; exit 0; fi',
            f"[ -x {v}/bin/python ] || {python} -c {shlex.quote(MAKE_VENV)} {v} >&2 || {{ echo novenv; exit 6; }}",
            f"{v}/bin/python -m pip --version >/dev/null 2>&1 || {v}/bin/python -m ensurepip --default-pip >&2 "
            "|| { echo nopip; exit 7; }",
            f"{pip}{' '.join(shlex.quote(r) for r in requirements)} >&2 || {{ echo pipfailed; exit 8; }}",
            f"echo {stamp} > {v}/{STAMP}",
            "echo installed",
        ]
    )


def ensure_venv(
    session: Session, directory: str, python: str, requirements: tuple[str, ...], wheelhouse: str = ""
) -> Installed:
    """Make ``<directory>/.venv`` hold ``requirements``; return its Python and what was done, for the report."""
    done = session.run(install_script(directory, python, requirements, wheelhouse), INSTALL_TIMEOUT_S, track=True)
    venv = f"{directory}/{VENV}"
    word = done.out.strip().splitlines()[-1] if done.out.strip() else ""
    if word == "ready":
        return Installed(f"{venv}/bin/python", f"dependencies already in {venv}")
    if word == "installed":
        return Installed(f"{venv}/bin/python", _what(done.err, venv, wheelhouse))
    last = _last(done.err)
    if word == "novenv":
        raise RemoteError(f"cannot create {venv} with {python}: {last} (apt-get install python3-venv there)")
    if word == "nopip":
        raise RemoteError(f"no pip for {python} there: {last} (apt-get install python3-pip there)")
    where = f"from {directory}/{wheelhouse}" if wheelhouse else "from the box's package index"
    raise RemoteError(f"pip could not install the dependencies into {venv} {where}: {last}")


def _what(pip_output: str, venv: str, wheelhouse: str) -> str:
    """Say what pip installed where (its 'Successfully installed' line), from where, and what the box kept."""
    found = [line for line in pip_output.splitlines() if line.startswith("Successfully installed ")]
    names = found[-1].removeprefix("Successfully installed ").split() if found else []
    how = "with the box's pip" + (f", --no-index from {wheelhouse}" if wheelhouse else "")
    kept = _kept(pip_output)
    how += f"; kept the box's {', '.join(kept)}" if kept else ""
    if not names:
        return f"installed nothing new into {venv} ({how}; pip found every dependency there)"
    return f"installed {len(names)} distributions into {venv} ({how}): {' '.join(names)}"


def _kept(pip_output: str) -> list[str]:
    """The box's own distributions pip found sufficient outside the virtualenv (its system site-packages)."""
    kept = []
    for line in pip_output.splitlines():
        found = re.match(r"Requirement already satisfied: ([A-Za-z0-9._-]+)\S* in (\S+).*\(([^()]+)\)$", line)
        if found and f"/{VENV}/" not in found.group(2):
            kept.append(f"{found.group(1).lower()} {found.group(3)}")
    return sorted(set(kept))


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "no message"


def requirements(root: Path) -> tuple[str, ...]:
    """The checkout's dependencies, as ``pyproject.toml`` lists them (torch is deliberately not among them).

    Read with ``tomllib`` (Python 3.11+), else ``tomli`` where it is installed (its backport for 3.10), else with
    ``project_dependencies``: gpu-preflight supports 3.10 without asking for another package.
    """
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib as toml
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as toml
        except ModuleNotFoundError:
            return project_dependencies(text)
    return tuple(toml.loads(text)["project"]["dependencies"])


def project_dependencies(text: str) -> tuple[str, ...]:
    """Read ``[project] dependencies = [...]`` from a pyproject.toml's text without a TOML library: the strings of
    that one array ("..." or '...'; comments and line breaks between them are allowed, as TOML allows)."""
    table = re.search(r"^\[project\][ \t]*(?:#.*)?$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    start = re.search(r"^dependencies\s*=\s*\[", table.group(1), re.M) if table else None
    if table is None or start is None:
        raise ValueError("pyproject.toml has no [project] dependencies array")
    found, rest = [], table.group(1)[start.end() :]
    token = re.compile(r"\s+|#[^\n]*|,|\]|\"((?:[^\"\\\n]|\\.)*)\"|'([^'\n]*)'")
    at = 0
    while (match := token.match(rest, at)) is not None and match.group(0) != "]":
        if match.group(1) is not None:
            found.append(json.loads(f'"{match.group(1)}"'))  # TOML's basic-string escapes are JSON's
        elif match.group(2) is not None:
            found.append(match.group(2))
        at = match.end()
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read [project] dependencies near {rest[at : at + 40]!r}")
    return tuple(found)
