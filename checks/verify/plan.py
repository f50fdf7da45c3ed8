"""``invoke verify``: plan the smoke run, gate on bootstrap's fast checks, run the child under the sampler.

gather (gate facts, the child's measurements, the sampler's trace) -> evaluate (``checks.verify.report``) ->
render (text, JSON, CSV, PNG). Everything the user can get wrong is checked before the child starts: a broken
staged directory, an unwritable checkpoint directory or report path, an unknown choice (one line, exit 2).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.config import PreflightConfig, VerifyConfig
from checks.errors import PreflightError
from checks.facts import AllocFacts, BenchFacts, MachineFacts
from checks.fileio import make_folders, remove_empty
from checks.machine.runner import run_checks
from checks.result import Result, Status, skip
from checks.verify.contract import (
    ChildRun,
    DataSpec,
)
from checks.verify.sampler import Trace
from checks.verify.staged import StagedDataError, inspect_staged, synthetic_spec

CHOICES = {
    "device": ("auto", "cuda", "cpu"),
    "precision": ("auto", "bf16", "fp16", "fp32"),
    "model_size": ("auto", "small", "base"),
    "data_kind": ("images", "tokens"),
}


@dataclass(frozen=True)
class Options:
    """The task's flags (0 / empty / -1: take the configured value)."""

    data: str = ""
    steps: int = 0
    batch_size: int = 0
    accum: int = 0
    workers: int = -1
    ckpt_dir: str = ""
    ckpt_every: int = 0
    price_per_hour: float = 0.0
    json: str = ""
    plot: str = ""
    sweep: bool = False
    ab: bool = False
    dataset: str = ""
    model: str = ""
    device: str = ""
    nproc: int = 0  # 0: preflight.verify.nproc (0 there: every GPU when two or more)


def effective(cfg: VerifyConfig, opts: Options) -> VerifyConfig:
    """Fold the flags into the configuration and validate the choices (exit 2 on a bad one)."""
    over: dict[str, Any] = {"steps": opts.steps, "accum": opts.accum, "checkpoint_every_steps": opts.ckpt_every}
    out = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v})
    if opts.device:
        out = dataclasses.replace(out, device=opts.device)
    if opts.price_per_hour:
        out = dataclasses.replace(out, price_per_hour=opts.price_per_hour)
    for key, allowed in CHOICES.items():
        if getattr(out, key) not in allowed:
            raise PreflightError(
                f"preflight.verify.{key} must be one of {', '.join(allowed)}, got {getattr(out, key)!r}"
            )
    for key in ("steps", "accum", "checkpoint_every_steps", "batch_size_cpu", "batch_size_gpu", "resume_steps"):
        if getattr(out, key) < 1:
            raise PreflightError(f"verify: {key.replace('_', '-')} must be at least 1, got {getattr(out, key)}")
    if out.measure_budget_s < 0:
        raise PreflightError(
            f"preflight.verify.measure_budget_s is {out.measure_budget_s:g}",
            hint="seconds for the measured steps (0: always measure verify.steps)",
        )
    if opts.batch_size < 0:
        raise PreflightError(f"verify: --batch-size cannot be negative, got {opts.batch_size}")
    if out.price_per_hour < 0:
        raise PreflightError(
            f"verify: the price per hour cannot be negative, got {out.price_per_hour:g}",
            hint="--price-per-hour or preflight.verify.price_per_hour: what the box costs an hour (0: no price)",
        )
    return out


def data_spec(opts: Options, cfg: VerifyConfig) -> DataSpec | None:
    """Validate ``--data`` (exit 2 on a broken staged directory) or describe synthetic data."""
    if opts.dataset:
        if opts.data:
            raise PreflightError("verify: give --data or --dataset, not both")
        return None
    if not opts.data:
        return synthetic_spec(cfg.data_kind, cfg.image_size, cfg.classes, cfg.seq_len)
    try:
        return inspect_staged(Path(opts.data).expanduser(), cfg.seq_len)
    except StagedDataError as exc:
        raise PreflightError(
            f"staged data: {exc}", hint=exc.hint or "re-run invoke stage-data, or check --data"
        ) from None


def workers_for(opts: Options, cfg: VerifyConfig, data: DataSpec | None) -> tuple[int, str]:
    """The DataLoader workers asked (``--workers``, else ``verify.num_workers``; -1: bootstrap's advice) and why they
    differ from that advice: none for the tool's own data (staged or synthetic), which is read in the training
    process. A staged dataset is a memory map with nothing left to decode: a worker only copies each batch once more
    through shared memory (BENCHMARKS.md "staged loader": 56k samples/s in-process vs 7.5k with 1 worker)."""
    workers = opts.workers if opts.workers >= 0 else cfg.num_workers
    if workers >= 0 or data is None:
        return workers, ""
    if data.source == "staged":
        return 0, "staged data: read in the training process, as staged_loader does (workers only copy it)"
    return 0, "synthetic data, made in memory: read in the training process (workers would only copy it)"


def checkpoint_dir(opts: Options, cfg: VerifyConfig, stack: ExitStack) -> tuple[str, bool]:
    """The checkpoint directory, created and proven writable; a temporary one when none is configured."""
    wanted = opts.ckpt_dir or cfg.checkpoint_dir
    if not wanted:
        return stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-preflight-ckpt-")), True
    path = Path(wanted).expanduser()
    try:
        made = make_folders(path)
        stack.callback(remove_empty, made)  # the run's own files are gone by then: leave the tree as it was
        probe = path / f".gpu-preflight-write-test.{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        raise PreflightError(
            f"checkpoint directory {path} is not writable: {exc.strerror or exc}", hint="pick another --ckpt-dir"
        ) from None
    return str(path), False


def outputs(json: str, plot: str, cfg: VerifyConfig, task: str = "verify") -> tuple[str, Path, Path]:
    """Where the JSON, the CSV and the PNG go: beside ``--json PATH``, else in the report directory."""
    stamp = time.strftime(f"{task}-%Y%m%d-%H%M%S")
    if json and json != "-":
        base = Path(json).expanduser()
        json_path = str(base)
    else:
        base = Path(cfg.report_dir).expanduser() / f"{stamp}.json"
        json_path = json or str(base)
    png = Path(plot).expanduser() if plot else base.with_suffix(".png")
    for path in (base, png):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PreflightError(f"cannot write reports to {path.parent}: {exc.strerror}") from None
        if path.is_dir() or not os.access(path.parent, os.W_OK):
            raise PreflightError(f"cannot write {path}", hint="pick writable --json / --plot paths")
    return json_path, base.with_name(base.stem + ".samples.csv"), png


def cpu_machine(facts: MachineFacts) -> bool:
    """No NVIDIA driver library, and a CPU-only torch build or no NVIDIA GPU on the PCI bus: a machine without a GPU
    by design, not a broken one."""
    if facts.nvml.error_kind != "library-not-found":
        return False
    return facts.host.nvidia_pci_gpus == 0 or (not facts.torch.error and facts.torch.cuda is None)


# What only a run on the GPU needs: on a --device cpu run their failures do not gate it.
GPU_SIDE = ("driver", "cuda-compat", "torch-arch", "torch-libs")


def gpu_side(result_id: str) -> bool:
    return result_id in GPU_SIDE or result_id.startswith("gpu-")


def gate(facts: MachineFacts, config: PreflightConfig, device: str = "auto") -> list[Result]:
    """Bootstrap's fast checks again: no micro-benchmarks, no allocator read-back (bootstrap's own steps).

    A ``--device cpu`` run is not gated by the GPU side: a CUDA torch on a box without a driver trains on the CPU
    as well as a CPU torch does, so what would fail or warn there is a skip that keeps its finding.
    """
    quiet = dataclasses.replace(config, bench=dataclasses.replace(config.bench, enabled=False))
    facts = dataclasses.replace(
        facts,
        bench=BenchFacts(skipped="verify re-runs the fast checks only (invoke bootstrap measures)"),
        alloc=AllocFacts(wanted="", variable="", skipped="verify skips the read-back (invoke bootstrap does it)"),
    )
    results = run_checks(facts, quiet)
    if cpu_machine(facts):
        reason = "no NVIDIA driver and a CPU-only torch: a CPU machine, verify trains on the CPU"
        results = [skip(r.id, reason) if r.id == "driver" and r.status is not Status.SKIP else r for r in results]
    if device == "cpu":
        results = [_cpu_run(r) if gpu_side(r.id) and r.status in (Status.FAIL, Status.WARN) else r for r in results]
    return results


def _cpu_run(r: Result) -> Result:
    return dataclasses.replace(
        r, status=Status.SKIP, summary=f"not needed for a CPU run (--device cpu): {r.summary}", hint=None
    )


@dataclass
class Outcome:
    """The gathered run: the child's result, the sampler's trace, the NVML index of the GPU the child used."""

    child: ChildRun
    trace: Trace
    gpu_index: int | None
    gpu_error: str | None


def write_outputs(
    csv: Path, png: Path, trace: Trace, title: str, gpu: int | None, cores: float, **plot: Any
) -> list[str]:
    """Write the sampler CSV and the PNG timeline; return what could not be written (the report says so)."""
    from checks.verify.plot import draw

    problems = []
    try:
        trace.write_csv(csv)
    except OSError as exc:
        problems.append(f"cannot write {csv}: {exc.strerror}")
    try:
        draw(png, trace, title, gpu, cores, **plot)
    except (OSError, ImportError) as exc:
        problems.append(f"cannot draw {png}: {exc}")
    return problems
