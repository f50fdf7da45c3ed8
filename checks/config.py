"""Typed views of the ``preflight`` configuration, and its validation.

``templates/defaults.yaml`` is the single source of keys, types and defaults. Invoke merges it with
invoke.yaml files, ``INVOKE_PREFLIGHT_*`` variables and ``-f FILE``; ``validate`` then rejects unknown keys
(suggesting the closest valid one) and wrong types, before any check runs.
"""

from __future__ import annotations

import copy
import difflib
import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checks.errors import PreflightError
from checks.typedjson import TypedJsonError, load

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
class TopologyConfig:
    """GPU to GPU inside one box: the p2p copy matrix and the local all-reduce."""

    p2p: bool
    p2p_mib: int
    p2p_warmup: int
    p2p_repeats: int
    p2p_timeout_s: float
    p2p_warn_fraction: float
    p2p_fail_fraction: float
    allreduce: bool
    allreduce_max_mib: int
    allreduce_budget_s: float
    allreduce_timeout_s: float
    allreduce_warn_fraction: float
    allreduce_fail_fraction: float


@dataclass(frozen=True)
class AllocConfig:
    apply: bool
    value: str
    rc_files: tuple[str, ...]
    without_gpu: bool


@dataclass(frozen=True)
class StageConfig:
    kind: str
    format: str
    size: int
    resize: str
    resample: str
    shard_size: int
    reserve_cores: int
    max_rejects: str
    text_field: str
    token_dtype: str
    path_column: str
    label_column: str
    dest_roots: tuple[str, ...]
    measured_max_age_h: float
    headroom_fraction: float
    ssh_command: str
    retries: int
    http_timeout_s: float


@dataclass(frozen=True)
class DiskConfig:
    enabled: bool
    locations: tuple[str, ...]
    max_locations: int
    budget_s: float
    max_file_mib: int
    max_free_fraction: float
    min_free_mib: int
    sync_mib: int
    small_file_kib: int
    max_small_files: int
    read_threads: int
    checkpoint_gib: float
    use_fio: bool
    stat_timeout_s: float
    read_warn_mb_s: float
    read_fail_mb_s: float
    write_warn_mb_s: float
    small_files_warn_per_s: float
    checkpoint_warn_s: float
    free_warn_fraction: float
    staging_min_free_gib: float


@dataclass(frozen=True)
class NetworkConfig:
    download_urls: tuple[str, ...]
    download_max_mib: int
    download_timeout_s: float
    download_warn_mb_s: float
    links: bool
    link_seconds: float
    link_omit_s: float
    link_streams: int
    rtt_pings: int
    use_iperf3: bool
    iperf3_port: int
    concurrent_pairs: bool
    link_warn_mbit_s: float
    link_fail_mbit_s: float
    allreduce: bool
    allreduce_max_mib: int
    allreduce_budget_s: float
    allreduce_timeout_s: float
    allreduce_meaningful_mib: int
    allreduce_link_fraction: float


@dataclass(frozen=True)
class HostsConfig:
    python: str
    remote_dir: str
    connect_timeout_s: float
    run_timeout_s: float
    dead_after_s: float
    parallel: int
    slurm: bool
    outlier_fraction: float
    install: bool
    wheelhouse: str
    job_wait_s: float


@dataclass(frozen=True)
class VerifyConfig:
    """``invoke verify`` / ``invoke watch``: the smoke loop, checkpoint round trip, sampler, gate, verdicts."""

    steps: int
    warmup: int
    batch_size_cpu: int
    batch_size_gpu: int
    accum: int
    device: str
    precision: str
    model_size: str
    data_kind: str
    image_size: int
    classes: int
    seq_len: int
    lr: float
    seed: int
    num_workers: int
    profile_steps: int
    advice_min_gain: float
    command_advice_s: float
    exchange_ab_tolerance: float
    contended_min_share: float
    timeout_s: float
    stall_timeout_s: float
    checkpoint_dir: str
    checkpoint_every_steps: int
    resume_steps: int
    resume_rtol: float
    sample_interval_s: float
    loss_must_decrease: bool
    min_samples_per_s: float
    price_per_hour: float
    report_dir: str
    sweep_max_batch: int
    sweep_warmup: int
    sweep_steps: int
    knee_fraction: float
    share_warn: float
    share_critical: float
    critical_min_steps: int
    measure_budget_s: float
    budget: float
    stable_width: float
    stable_batches: int
    compute_bound_min: float
    cpu_saturated_fraction: float
    iowait_high_pct: float
    checkpoint_share_warn: float
    launch_busy_max: float
    launch_kernel_us_max: float
    near_oom_fraction: float
    fragmentation_ratio: float
    fragmentation_min_fraction: float
    throttle_clock_fraction: float
    gpu_util_low_pct: float
    gpu_util_busy_pct: float
    starved_sample_fraction: float
    watch_seconds: int
    nproc: int
    straggler_share: float


@dataclass(frozen=True)
class EnvConfig:
    """``invoke lock`` / ``invoke diff`` / the env-lock check."""

    lock: str
    packages: tuple[str, ...]
    nvcc_timeout_s: float


@dataclass(frozen=True)
class PlanConfig:
    """``invoke plan``: prices per card class and the fixed memory terms."""

    prices: dict[str, float]
    lora_rank: int
    cuda_context_mib: int
    nccl_mib: int
    fragmentation_fraction: float
    nvml_total_fraction: float
    max_gpus: int
    measure_timeout_s: float


@dataclass(frozen=True)
class SlurmConfig:
    """``invoke bootstrap --hook`` and ``--drain``: the hook's budget, the drain reason, scontrol's timeout."""

    hook_budget_s: float
    reason_max_chars: int
    scontrol_timeout_s: float


@dataclass(frozen=True)
class PreflightConfig:
    report: ReportConfig
    probe: ProbeConfig
    torch: TorchConfig
    gpu: GpuConfig
    host: HostConfig
    dataloader: DataLoaderConfig
    bench: BenchConfig
    topology: TopologyConfig
    alloc_conf: AllocConfig
    stage: StageConfig
    disk: DiskConfig
    network: NetworkConfig
    hosts: HostsConfig
    verify: VerifyConfig
    env: EnvConfig
    plan: PlanConfig
    slurm: SlurmConfig


def load_defaults() -> dict[str, Any]:
    """Return the ``preflight`` mapping of ``templates/defaults.yaml`` (a fresh copy: the caller may change it)."""
    return copy.deepcopy(_parsed_defaults())


@functools.cache
def _parsed_defaults() -> dict[str, Any]:
    # Parsed once per process, with libyaml where PyYAML has it: the pure-Python parser takes ~50 ms for this
    # file, and every make_config() reads it (the test suite builds thousands of configs).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with DEFAULTS_FILE.open(encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=loader)
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


def _fitting(value: Any, defaults: dict[str, Any]) -> list[str]:
    """Names to suggest for a mistyped key: for a section, those holding every key given under it (host/hosts)."""
    if isinstance(value, dict) and value:
        fitting = [k for k, d in defaults.items() if isinstance(d, dict) and set(value) <= set(d)]
        return fitting or list(defaults)
    return list(defaults)


def _numbers(mapping: dict[str, Any], path: str) -> None:
    for key, value in mapping.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PreflightError(f"configuration key {path}.{key} must be a number, got {value!r}")


def validate(merged: dict[str, Any], defaults: dict[str, Any], prefix: str = "preflight") -> None:
    """Raise ``PreflightError`` for the first unknown key or wrongly typed value in ``merged``."""
    for key, value in merged.items():
        path = f"{prefix}.{key}"
        if key not in defaults:
            close = difflib.get_close_matches(key, _fitting(value, defaults), n=1, cutoff=0.5)
            hint = f"did you mean {prefix}.{close[0]}?" if close else f"valid keys: {', '.join(sorted(defaults))}"
            raise PreflightError(f"unknown configuration key {path}", hint=hint)
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise PreflightError(f"configuration key {path} must be a section, got {value!r}")
            if default:
                validate(value, default, path)
            else:  # an open mapping (plan.prices): any name, numbers only
                _numbers(value, path)
        elif not _type_ok(default, value):
            raise PreflightError(
                f"configuration key {path} must be {_type_name(default)}, got {value!r}",
                hint=f"default: {default!r}",
            )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's complaint with the line and column it points at (both counted from 1, as editors do)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    return str(exc).splitlines()[0]


def _check_top_level(data: Any, path: Path, top_level: tuple[str, ...], own: bool) -> None:
    """A top-level key that is neither ``preflight`` nor one of ``top_level`` (Invoke's own) is refused.

    ``own`` false (the system and user files, which may serve other Invoke projects too): only a key close to
    a known one, a misspelling, is refused.
    """
    if not top_level or not isinstance(data, dict):
        return
    known = ("preflight", *top_level)
    for key in data:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        if key not in known and (own or close):
            hint = f"did you mean {close[0]}?" if close else f"known top-level keys: {', '.join(known)}"
            raise PreflightError(f"unknown top-level key {key!r} in {path}", hint=hint)


def validate_files(paths: list[Path], top_level: tuple[str, ...] = (), own: bool = True) -> None:
    """Validate the ``preflight`` part of each existing config file before Invoke merges them.

    Invoke's own merge fails with a traceback when a file puts a value where a section belongs (or the
    reverse), and a YAML syntax error is a traceback too; both become one line naming the file here (with
    PyYAML's line and column). With ``top_level`` (Invoke's own keys) a misspelled ``prefligth:`` is refused
    too, where Invoke would ignore it and run on the defaults.
    """
    defaults = load_defaults()
    for path in paths:
        if not path.is_file():
            continue
        try:
            with path.open(encoding="utf-8") as fh:
                data = yaml.safe_load(fh)  # JSON is YAML too
        except yaml.YAMLError as exc:
            raise PreflightError(f"configuration file {path} is not valid YAML/JSON: {_yaml_problem(exc)}") from None
        except UnicodeDecodeError as exc:
            raise PreflightError(f"configuration file {path} is not valid YAML/JSON: {exc}") from None
        except OSError as exc:
            raise PreflightError(f"configuration file {path} cannot be read: {exc.strerror}") from None
        _check_top_level(data, path, top_level, own)
        section = data.get("preflight") if isinstance(data, dict) else None
        if section is None:
            continue
        if not isinstance(section, dict):
            raise PreflightError(f"in {path}: preflight must be a section, got {section!r}")
        try:
            validate(section, defaults)
        except PreflightError as exc:
            raise PreflightError(f"in {path}: {str(exc).removeprefix('gpu-preflight: ')}") from None


def make_config(merged: Any = None) -> PreflightConfig:
    """Validate a merged ``preflight`` mapping (None: the defaults alone) and return its typed view."""
    defaults = load_defaults()
    data = plain(merged) if merged is not None else defaults
    validate(data, defaults)
    full = _merge(defaults, data)
    try:  # validated against the defaults above; typedjson holds the defaults to the dataclasses' own types
        return typing.cast(PreflightConfig, load(PreflightConfig, full, "preflight"))
    except TypedJsonError as exc:  # a default that does not fit its field: ours to fix, not the user's
        raise AssertionError(f"templates/defaults.yaml does not fit checks/config.py: {exc}") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) else value
    return out
