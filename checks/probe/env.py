"""The software-environment part of the seam: OS and glibc, kernel, CPU features, the CUDA toolkit (nvcc), the
Python distributions installed in this interpreter, and the environment variables that change behaviour.

Distributions are read with ``importlib.metadata`` in this process: the tool runs with the training Python (the
torch probe's child uses the same interpreter), so what it sees is what training imports. No ``pip`` subprocess.
Command line equivalents: ``cat /etc/os-release``, ``ldd --version``, ``grep flags /proc/cpuinfo``,
``nvcc --version``, ``pip list``, ``env``.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement

from checks.facts import EnvFacts
from checks.probe.net import redact

# Prefixes and names of the variables that change what training does (docs/sources.md#nccl-env-vars:
# NCCL_* table; CUDA_*, PYTORCH_* and the thread counts change kernels, devices and the allocator).
VARIABLE_PREFIXES = ("CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "MKL_", "HF_", "TRANSFORMERS_", "NVIDIA_")
VARIABLE_NAMES = (
    "OMP_NUM_THREADS",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "CUBLAS_WORKSPACE_CONFIG",
    "TOKENIZERS_PARALLELISM",
)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
HIDDEN = "<redacted>"
# CPU flags that select kernels (oneDNN/MKL paths, bf16 on the CPU): x86 /proc/cpuinfo "flags", Arm "Features".
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm")  # fmt: skip
_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it: ``Foo_Bar.baz`` is ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_env(
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
    *,
    distributions: Iterable[metadata.Distribution] | None = None,
    nvcc_timeout_s: float = 10.0,
) -> EnvFacts:
    """Gather the environment facts of this interpreter and host (``root`` and ``environ`` replace the live ones)."""
    env = os.environ if environ is None else environ
    live = root == Path("/")
    os_release = _os_release(root)
    nvcc_path = find_nvcc(env)
    nvcc_version, nvcc_error = nvcc_release(nvcc_path, nvcc_timeout_s) if nvcc_path else (None, None)
    cpu_model, flags = _cpu(root)
    return EnvFacts(
        os_name=os_release.get("PRETTY_NAME"),
        os_id=" ".join(v for v in (os_release.get("ID"), os_release.get("VERSION_ID")) if v) or None,
        glibc=_glibc() if live else None,
        kernel=platform.release() or None if live else None,
        arch=platform.machine() or None,
        cpu_model=cpu_model,
        cpu_flags=flags,
        python=platform.python_version(),
        python_executable=sys.executable,
        nvcc_version=nvcc_version,
        nvcc_path=nvcc_path,
        nvcc_error=nvcc_error,
        cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH"),
        packages=installed(distributions),
        variables=variables(env),
    )


def _os_release(root: Path) -> dict[str, str]:
    """Parse /etc/os-release (or /usr/lib/os-release, its fallback per os-release(5))."""
    for path in (root / "etc" / "os-release", root / "usr" / "lib" / "os-release"):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                out[key.strip()] = value.strip().strip("\"'")
        return out
    return {}


def _glibc() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    return text.removeprefix("glibc ").strip() or None


def _cpu(root: Path) -> tuple[str | None, tuple[str, ...]]:
    """CPU model name and the kernel-selecting flags of the first processor in /proc/cpuinfo."""
    try:
        text = (root / "proc" / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, ()
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model") and model is None and value.strip():
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, tuple(f for f in CPU_FLAGS if f in flags)


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 flags of native bf16 math; Arm's Features say "bf16"


def native_bf16(cpuinfo: str | None) -> bool | None:
    """Whether the first processor of /proc/cpuinfo text does bf16 math natively (docs/sources.md#cpu-bf16):
    ``avx512_bf16``/``amx_bf16`` among x86 ``flags``, ``bf16`` among Arm ``Features``; None: no such line."""
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return any(f in value.split() for f in BF16_FLAGS)
        if sep and key.strip() == "Features":
            return "bf16" in value.split()
    return None


def read_native_bf16(root: Path = Path("/")) -> bool | None:
    """``native_bf16`` of this machine (None where /proc/cpuinfo cannot be read). Command line equivalent:
    ``grep -m1 -o -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo``."""
    try:
        return native_bf16((root / "proc" / "cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None


def find_nvcc(env: Mapping[str, str]) -> str | None:
    """nvcc on PATH, else under CUDA_HOME / CUDA_PATH, else /usr/local/cuda (where NVIDIA's images put it)."""
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    if found:
        return found
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            return str(Path(home) / "bin" / "nvcc")
    return None


def nvcc_release(path: str, timeout_s: float) -> tuple[str | None, str | None]:
    """``nvcc --version``'s release ("12.8"), or the reason it gave none."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{path} --version gave no answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"{path} --version failed: {exc.strerror}"
    match = _NVCC_RELEASE.search(done.stdout)
    if match is None:
        return None, f"{path} --version printed no release (exit {done.returncode})"
    return match.group(1), None


def installed(distributions: Iterable[metadata.Distribution] | None = None) -> dict[str, str]:
    """Normalized name -> version of every distribution this interpreter can import (first on sys.path wins)."""
    out: dict[str, str] = {}
    for dist in metadata.distributions() if distributions is None else distributions:
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return dict(sorted(out.items()))


def variables(env: Mapping[str, str]) -> dict[str, str]:
    """The behaviour-changing variables; secret-named ones hidden, URLs with their credentials and queries hidden."""
    out = {}
    for key in sorted(env):
        if not (key.startswith(VARIABLE_PREFIXES) or key in VARIABLE_NAMES):
            continue
        value = env[key]
        if _SECRET_NAME.search(key):
            value = HIDDEN
        elif "://" in value:
            value = redact(value)
        out[key] = value
    return out


def requirement_closure(roots: Iterable[str]) -> dict[str, str]:
    """The installed distributions ``roots`` name and everything they require (markers of this interpreter;
    extras not followed), as normalized name -> version. Names that are not installed are left out."""
    marker_env = {k: str(v) for k, v in default_environment().items()} | {"extra": ""}
    by_name = {normalize(d.metadata["Name"] or ""): d for d in metadata.distributions()}
    todo, seen = [normalize(r) for r in roots], {}
    while todo:
        name = todo.pop()
        dist = by_name.get(name)
        if dist is None or name in seen:
            continue
        seen[name] = dist.version
        for line in dist.requires or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate(marker_env):
                todo.append(normalize(req.name))
    return dict(sorted(seen.items()))
