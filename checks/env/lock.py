"""``invoke lock --out FILE`` and bootstrap's ``env-lock`` check.

A lock is a pip requirements file (``pip install -r FILE`` reproduces it) whose comment header records the box
it was made on::

    # gpu-preflight lock 1
    # made on: box1 · NVIDIA H200 x1 · driver 580.95.05 (CUDA 13.0) · torch 2.9.1+cu128 (CUDA 12.8) · Python 3.12.3
    # install: pip install -r THIS_FILE (gpu-preflight never installs anything)
    --extra-index-url https://download.pytorch.org/whl/cu128
    torch==2.9.1+cu128
    numpy==2.1.0

Only exact pins (``name==version``) and the index options ``--index-url``, ``--extra-index-url``, ``-i``,
``--find-links`` are allowed. By default the lock pins ``preflight.env.packages`` and what they require (what
training imports), ``--all`` every distribution but pip's own tools (as ``pip freeze`` leaves them out).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.facts import MachineFacts
from checks.fileio import read_text, write_atomic
from checks.machine.measurements import environment
from checks.probe import LocalProbe
from checks.probe.env import normalize, requirement_closure
from checks.result import Result, fail, ok, skip
from checks.tables.torchbuilds import PYTORCH_WHEEL_INDEX, driver_cuda, parse_cuda

LOCK_HEADER = "# gpu-preflight lock 1"
_OPTIONS = ("--index-url", "--extra-index-url", "-i", "--find-links")
_FREEZE_SKIPS = {"pip", "setuptools", "wheel", "distribute"}
_CUDA_LOCAL = re.compile(r"^cu(\d+)(\d)$")


@dataclass(frozen=True)
class Pin:
    name: str  # normalized
    version: str
    line: int


@dataclass(frozen=True)
class Lock:
    path: Path
    pins: tuple[Pin, ...]
    options: tuple[str, ...]  # index lines, as written
    made_on: str | None = None


@dataclass(frozen=True)
class LockRequest:
    """``invoke lock``: write this environment's pins to ``out``; ``everything``: every distribution."""

    config: PreflightConfig
    out: Path
    everything: bool = False


def torch_index(m: MachineFacts, wheel_index: str) -> str | None:
    """The wheel index folder of this torch build: its local version (``+cu128``), else torch.version.cuda."""
    if not m.torch.version:
        return None
    local = Version(m.torch.version).local if _valid(m.torch.version) else None
    build = local if local and (local == "cpu" or _CUDA_LOCAL.match(local)) else None
    cuda = parse_cuda(m.torch.cuda)
    build = build or (f"cu{cuda[0]}{cuda[1]}" if cuda else "cpu")
    return f"{(wheel_index or PYTORCH_WHEEL_INDEX).rstrip('/')}/{build}"


def lock_text(m: MachineFacts, pins: dict[str, str], wheel_index: str) -> str:
    """The lock file for ``pins`` (name -> version) made on the machine ``m``."""
    gpus = [g.name for g in m.nvml.gpus if not g.error]
    gpu = f"{gpus[0]} x{len(gpus)}" if gpus else "no NVIDIA GPU"
    summary = environment(m).summary
    lines = [LOCK_HEADER, f"# made on: {m.host.hostname} · {gpu} · {summary}"]
    lines.append("# install: pip install -r THIS_FILE (gpu-preflight only writes and checks it; it never installs)")
    index = torch_index(m, wheel_index) if "torch" in pins else None
    if index:
        lines.append(f"--extra-index-url {index}")
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    return "\n".join(lines) + "\n"


def make_lock(request: LockRequest) -> tuple[MachineFacts, dict[str, str]]:
    """Read this environment and write its lock; return the facts and the pins written."""
    cfg = request.config
    facts = LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s).machine()
    packages = facts.env.packages if facts.env else {}
    if request.everything:
        pins = {k: v for k, v in packages.items() if k not in _FREEZE_SKIPS}
    else:
        pins = requirement_closure(cfg.env.packages)
    if not pins:
        raise PreflightError(
            f"none of preflight.env.packages is installed in {facts.env.python_executable if facts.env else 'this Python'}",
            hint="run lock with your training Python, list your packages in preflight.env.packages, or pass --all",
        )
    try:
        write_atomic(request.out, lock_text(facts, pins, cfg.torch.wheel_index))
    except OSError as exc:
        raise PreflightError(
            f"cannot write the lock {request.out}: {exc.strerror}", hint="pick a writable --out"
        ) from None
    return facts, pins


def _valid(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def read_lock(path: Path) -> Lock:
    """Parse a lock file; a line that is not an exact pin or an index option is an error with line and column."""
    text = read_text(path, "lock file", "write one with `invoke lock --out FILE`")
    pins, options, made_on = [], [], None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if raw.startswith("# made on: "):
            made_on = raw.removeprefix("# made on: ").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            if line.split()[0].split("=")[0] not in _OPTIONS:
                raise PreflightError(
                    f"{path}:{number}:1: unsupported option {line.split()[0]!r}",
                    hint=f"a lock holds name==version pins and {', '.join(_OPTIONS)}",
                )
            options.append(line)
            continue
        pins.append(_pin(path, number, raw, line))
    return Lock(path, tuple(pins), tuple(options), made_on)


def _pin(path: Path, number: int, raw: str, line: str) -> Pin:
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        message, *rest = str(exc).splitlines()
        column = rest[-1].index("^") - 3 + (len(raw) - len(raw.lstrip())) if rest else 1  # packaging indents by 4
        raise PreflightError(
            f"{path}:{number}:{column}: {message}", hint="each line is name==version (pip requirements syntax)"
        ) from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "==="):
        raise PreflightError(
            f"{path}:{number}:1: {line!r} is not an exact pin",
            hint="a lock pins name==version; `invoke lock` writes them",
        )
    return Pin(normalize(req.name), specs[0].version, number)


def _same(a: str, b: str) -> bool:
    if _valid(a) and _valid(b):
        return Version(a) == Version(b)
    return a == b


def env_lock(m: MachineFacts, lock: Lock) -> list[Result]:
    """Every pin of the lock installed at its version; the lock's torch CUDA build usable with this driver.

    Command line equivalent: pip install --dry-run -r LOCK (nothing is installed here).
    """
    if m.env is None:
        return [skip("env-lock", "this snapshot holds no installed packages (recorded before they were): re-record it")]
    index = " ".join(o for o in lock.options if o.startswith(("--extra-index-url", "--index-url", "-i")))
    # The pip of the Python that runs training (and this check): a bare `pip` may be another environment's.
    pip = f"{shlex.quote(m.env.python_executable)} -m pip" if m.env.python_executable else "pip"
    out = []
    for pin in lock.pins:
        have = m.env.packages.get(pin.name)
        if have is not None and _same(have, pin.version):
            continue
        fix = f"{pip} install '{pin.name}=={pin.version}'" + (f" {index}" if index and pin.name == "torch" else "")
        state = "missing" if have is None else f"{have} installed"
        out.append(fail("env-lock", f"{pin.name}: {state}, the lock pins {pin.version} (line {pin.line})",
                        f"{fix} (if pip finds no such version, the pin is gone from the index: re-lock on a box that works)",
                        subject=pin.name, value=have, expected=pin.version))  # fmt: skip
    out += _torch_vs_driver(m, lock)
    if not out:
        where = f" (made on {lock.made_on})" if lock.made_on else ""
        out.append(ok("env-lock", f"all {len(lock.pins)} pins of {lock.path.name} installed at their versions{where}"))
    return out


def _torch_vs_driver(m: MachineFacts, lock: Lock) -> list[Result]:
    """The lock's torch wheel for CUDA X needs a driver for CUDA X's major (minor compatibility, docs/sources.md#cuda-driver-compat)."""
    torch = next((p for p in lock.pins if p.name == "torch"), None)
    local = Version(torch.version).local if torch and _valid(torch.version) else None
    match = _CUDA_LOCAL.match(local or "")
    driver = driver_cuda(m.nvml.cuda_driver_version)
    if torch is None or match is None or driver is None:
        return []
    build = (int(match.group(1)), int(match.group(2)))
    if build[0] <= driver[0]:
        return []
    return [fail("env-lock", f"the lock's torch {torch.version} needs a driver for CUDA {build[0]}.{build[1]}; this one supports {driver[0]}.{driver[1]}",
                 "rent a box with a newer driver, or re-lock with a torch build for this driver's CUDA", subject="torch-cuda")]  # fmt: skip


def lock_check(lock: Lock) -> Callable[[MachineFacts, PreflightConfig], list[Result]]:
    """The env-lock check bound to a parsed lock, in the runner's (facts, config) shape."""

    def check(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
        return env_lock(m, lock)

    return check
