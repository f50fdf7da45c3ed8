"""Typed views of the ``preflight`` configuration, and its validation.

``templates/defaults.yaml`` is the single source of keys, types and defaults. Invoke merges it with
invoke.yaml files, ``INVOKE_PREFLIGHT_*`` variables and ``-f FILE``; ``validate`` then rejects unknown keys
(suggesting the closest valid one) and wrong types, before any check runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checks.errors import PreflightError

DEFAULTS_FILE = Path(__file__).resolve().parent.parent / "templates" / "defaults.yaml"


@dataclass(frozen=True)
class ReportConfig:
    strict: bool


@dataclass(frozen=True)
class ProbeConfig:
    torch_timeout_s: float
    alloc_timeout_s: float


@dataclass(frozen=True)
class TorchConfig:
    wheel_index: str


@dataclass(frozen=True)
class GpuConfig:
    power_min_fraction: float
    pcie_fail_fraction: float
    processes_fail_fraction: float
    idle_memory_warn_fraction: float


@dataclass(frozen=True)
class HostConfig:
    cores_per_gpu_warn: float
    cores_per_gpu_fail: float
    ram_per_gpu_min_ratio: float
    shm_min_mib: int
    shm_per_worker_mib: int
    nofile_min: int
    memlock_min_gib: float


@dataclass(frozen=True)
class DataLoaderConfig:
    reserve_cores: int
    max_workers: int
    prefetch_factor: int


@dataclass(frozen=True)
class BenchConfig:
    enabled: bool
    timeout_s: float
    copy_mib: int
    d2d_mib: int
    matmul_n: int
    warmup: int
    repeats: int
    link_warn_fraction: float
    link_fail_fraction: float
    d2d_warn_fraction: float
    d2d_fail_fraction: float
    matmul_warn_fraction: float
    matmul_fail_fraction: float
    outlier_fraction: float


@dataclass(frozen=True)
class AllocConfig:
    apply: bool
    value: str
    rc_files: tuple[str, ...]


@dataclass(frozen=True)
class PreflightConfig:
    report: ReportConfig
    probe: ProbeConfig
    torch: TorchConfig
    gpu: GpuConfig
    host: HostConfig
    dataloader: DataLoaderConfig
    bench: BenchConfig
    alloc_conf: AllocConfig


def load_defaults() -> dict[str, Any]:
    """Return the ``preflight`` mapping of ``templates/defaults.yaml``."""
    with DEFAULTS_FILE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return typing.cast(dict[str, Any], data["preflight"])


def plain(value: Any) -> Any:
    """Copy Invoke's DataProxy (or any mapping) into plain dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _type_ok(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


def _type_name(value: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list of strings"}.get(
        type(value), type(value).__name__
    )


def validate(merged: dict[str, Any], defaults: dict[str, Any], prefix: str = "preflight") -> None:
    """Raise ``PreflightError`` for the first unknown key or wrongly typed value in ``merged``."""
    for key, value in merged.items():
        path = f"{prefix}.{key}"
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1, cutoff=0.5)
            hint = f"did you mean {prefix}.{close[0]}?" if close else f"valid keys: {', '.join(sorted(defaults))}"
            raise PreflightError(f"unknown configuration key {path}", hint=hint)
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise PreflightError(f"configuration key {path} must be a section, got {value!r}")
            validate(value, default, path)
        elif not _type_ok(default, value):
            raise PreflightError(
                f"configuration key {path} must be {_type_name(default)}, got {value!r}",
                hint=f"default: {default!r}",
            )


def validate_files(paths: list[Path]) -> None:
    """Validate the ``preflight`` part of each existing config file before Invoke merges them.

    Invoke's own merge fails with a traceback when a file puts a value where a section belongs (or the
    reverse), and a YAML syntax error is a traceback too; both become one line naming the file here.
    """
    defaults = load_defaults()
    for path in paths:
        if not path.is_file():
            continue
        try:
            with path.open(encoding="utf-8") as fh:
                data = yaml.safe_load(fh)  # JSON is YAML too
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise PreflightError(
                f"configuration file {path} is not valid YAML/JSON: {str(exc).splitlines()[0]}"
            ) from None
        except OSError as exc:
            raise PreflightError(f"configuration file {path} cannot be read: {exc.strerror}") from None
        section = data.get("preflight") if isinstance(data, dict) else None
        if section is None:
            continue
        if not isinstance(section, dict):
            raise PreflightError(f"in {path}: preflight must be a section, got {section!r}")
        try:
            validate(section, defaults)
        except PreflightError as exc:
            raise PreflightError(f"in {path}: {str(exc).removeprefix('gpu-preflight: ')}") from None


def _build(cls: Any, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, value)
        elif tp is float:
            kwargs[f.name] = float(value)
        elif typing.get_origin(tp) is tuple:
            kwargs[f.name] = tuple(value)
        else:
            kwargs[f.name] = value
    return cls(**kwargs)


def make_config(merged: Any = None) -> PreflightConfig:
    """Validate a merged ``preflight`` mapping (None: the defaults alone) and return its typed view."""
    defaults = load_defaults()
    data = plain(merged) if merged is not None else defaults
    validate(data, defaults)
    full = _merge(defaults, data)
    return typing.cast(PreflightConfig, _build(PreflightConfig, full))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) else value
    return out
