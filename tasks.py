"""gpu-preflight tasks: ``invoke bootstrap``, ``invoke snapshot``, ``invoke alloc-conf``.

Thin on purpose: parse flags, build the typed config, call the packages, print, pick the exit code.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from checks.config import PreflightConfig, load_defaults, make_config, validate_files
from checks.env_config import check_env_overrides
from checks.errors import ExitStatus, PreflightError
from checks.facts import AllocFacts, MachineFacts
from checks.fileio import write_atomic
from checks.probe import LocalProbe, Probe, SnapshotProbe
from checks.render import render_text, use_colour
from checks.result import Report
from checks.runner import run_checks
from checks.snapshot import dump_snapshot, to_jsonable, write_snapshot
from provision.alloc_env import Change, choose_value, ensure_alloc_conf, ensure_alloc_conf_removed, variables_for


def _config_files(argv: list[str], environ: Mapping[str, str]) -> list[Path]:
    """The files Invoke will merge (system, user, project, runtime ``-f``), in its order; .py files are skipped."""
    stems = [Path("/etc/invoke"), Path(os.path.expanduser("~/.invoke")), Path(__file__).resolve().parent / "invoke"]
    files = [stem.with_name(stem.name + ext) for stem in stems for ext in (".yaml", ".yml", ".json")]
    runtime = environ.get("INVOKE_RUNTIME_CONFIG")
    for i, arg in enumerate(argv):
        if arg in ("-f", "--config") and i + 1 < len(argv):
            runtime = argv[i + 1]
        elif arg.startswith("--config="):
            runtime = arg.split("=", 1)[1]
        elif arg.startswith("-f") and len(arg) > 2:
            runtime = arg[2:]
    return files + ([Path(runtime)] if runtime else [])


# Before Invoke merges files and casts variables: a bad value is one line and exit 2, not a traceback.
check_env_overrides(os.environ, load_defaults())
validate_files(_config_files(sys.argv, os.environ))


def settings(c: Context) -> PreflightConfig:
    """Validate the merged ``preflight`` configuration (exit 2 on unknown keys or wrong types)."""
    return make_config(c.config.get("preflight", {}))


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the task with exit 130 and one line, not a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        raise Exit("gpu-preflight: interrupted", code=ExitStatus.INTERRUPTED) from None


def _probe(machine: str, cfg: PreflightConfig) -> Probe:
    return SnapshotProbe(Path(machine)) if machine else LocalProbe(cfg.probe.torch_timeout_s)


def _rc_paths(cfg: PreflightConfig) -> list[Path]:
    return [Path(os.path.expanduser(p)) for p in cfg.alloc_conf.rc_files]


def _diff(change: Change) -> str:
    before = (change.before or "").splitlines(keepends=True)
    after = change.after.splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, f"{change.path} (now)", f"{change.path} (after)"))


def _alloc(
    probe: Probe, facts: MachineFacts, cfg: PreflightConfig, dry_run: bool, apply: bool
) -> tuple[AllocFacts, list[str]]:
    """Apply the allocator setting (unless dry run / disabled / replay) and read it back."""
    value, variables = choose_value(cfg.alloc_conf.value, facts.torch.version), variables_for(facts.torch.version)
    if not probe.live:
        return probe.alloc(value, variables, cfg), []
    if facts.torch.error:
        return AllocFacts(value, variables[0], skipped="torch is not importable (see torch-build)"), []
    if not apply:
        return dataclasses.replace(probe.alloc(value, variables, cfg), applied=False), []
    changes = ensure_alloc_conf(_rc_paths(cfg), value, variables, dry_run=dry_run)
    notes = [_diff(ch) for ch in changes] if dry_run else [f"wrote allocator settings to {ch.path}" for ch in changes]
    if dry_run:
        return AllocFacts(value, variables[0], skipped="dry run: nothing written, nothing to read back"), notes
    return probe.alloc(value, variables, cfg), notes


def _emit(report: Report, json_path: str) -> None:
    """Human text to stdout (stderr when JSON goes to stdout); JSON to a file or stdout."""
    text_stream = sys.stderr if json_path == "-" else sys.stdout
    text_stream.write(render_text(report, colour=use_colour(text_stream, os.environ)))
    if not json_path:
        return
    payload = json.dumps(report.to_json(), indent=2) + "\n"
    if json_path == "-":
        sys.stdout.write(payload)
        return
    path = Path(json_path)
    try:
        write_atomic(path, payload)
    except OSError as exc:
        raise PreflightError(
            f"cannot write the JSON report to {path}: {exc.strerror}", hint="pick a writable --json path"
        ) from None


def _check_output_path(json_path: str) -> None:
    """Fail before the run, not after it, when the JSON report cannot be written."""
    if not json_path or json_path == "-":
        return
    path = Path(json_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PreflightError(
            f"cannot write the JSON report to {path}: {exc.strerror}", hint="pick a writable --json path"
        ) from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise PreflightError(f"cannot write the JSON report to {path}", hint="pick a writable --json path")


def _measurements(facts: MachineFacts, cfg: PreflightConfig, notes: list[str]) -> dict[str, Any]:
    from checks.resources import loader_advice

    out: dict[str, Any] = {"dataloader": loader_advice(facts, cfg).as_dict()}
    if facts.bench is not None and facts.bench.gpus:
        out["gpu_bench"] = to_jsonable(facts.bench.gpus)
    links = {
        f"gpu{g.index}": {"gen": g.pcie_gen_loaded, "width": g.pcie_width_loaded}
        for g in facts.nvml.gpus
        if g.pcie_gen_loaded
    }
    if links:
        out["pcie_under_load"] = links
    if notes:
        out["alloc_conf_changes"] = notes
    return out


@task(
    help={
        "json": "also write the JSON report to PATH ('-' for stdout; the text report then goes to stderr)",
        "machine": "judge a machine snapshot FILE instead of this machine (see `invoke snapshot`)",
        "strict": "exit 1 on warnings too",
        "bench": "run the GPU micro-benchmarks (default on; --no-bench skips them)",
        "dry_run": "show what the allocator setting would change in the shell files, write nothing",
    }
)
def bootstrap(
    c: Context, json: str = "", machine: str = "", strict: bool = False, bench: bool = True, dry_run: bool = False
) -> None:
    """Check this machine right after renting it: driver, CUDA, torch build, GPUs, CPU/RAM/shm, benchmarks."""
    cfg = settings(c)
    _check_output_path(json)
    if not bench:
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, enabled=False))
    with interruptible():
        probe = _probe(machine, cfg)
        facts = probe.measure(probe.machine(), cfg)
        alloc, notes = _alloc(probe, facts, cfg, dry_run, apply=cfg.alloc_conf.apply)
        facts = dataclasses.replace(facts, alloc=alloc)
        results = run_checks(facts, cfg)
    report = Report(facts.host.hostname, probe.label, tuple(results), _measurements(facts, cfg, notes))
    for note in notes:
        sys.stderr.write(note if note.endswith("\n") else note + "\n")
    _emit(report, json)
    code = report.exit_code(strict=strict or cfg.report.strict)
    if code:
        raise Exit(code=code)


@task(
    help={
        "out": "snapshot FILE to write (JSON; share it to reproduce a report anywhere)",
        "description": "free text stored in the snapshot: what this machine is",
        "bench": "also run and record the GPU micro-benchmarks (and PCIe links under load)",
    }
)
def snapshot(c: Context, out: str = "", description: str = "", bench: bool = False) -> None:
    """Record this machine's facts to a snapshot file that `invoke bootstrap --machine FILE` replays."""
    if not out:
        raise PreflightError("snapshot needs --out FILE", hint="e.g. invoke snapshot --out box.json")
    cfg = settings(c)
    with interruptible():
        probe = LocalProbe(cfg.probe.torch_timeout_s)
        facts = probe.machine()
        if bench:
            facts = probe.measure(facts, cfg)
    try:
        write_snapshot(Path(out), dump_snapshot(facts, recorded=True, description=description))
    except OSError as exc:
        raise PreflightError(f"cannot write snapshot {out}: {exc.strerror}") from None
    gpus = len(facts.nvml.gpus)
    print(f"wrote {out}: {gpus} GPU(s), torch {facts.torch.version or 'missing'}, host {facts.host.hostname}")


@task(
    name="alloc-conf",
    help={"dry_run": "show the change, write nothing", "undo": "remove the block gpu-preflight wrote"},
)
def alloc_conf(c: Context, dry_run: bool = False, undo: bool = False) -> None:
    """Write PYTORCH_CUDA_ALLOC_CONF into the shell start-up files and prove a fresh shell's torch reads it."""
    cfg = settings(c)
    paths = _rc_paths(cfg)
    if undo:
        with interruptible():
            changes = ensure_alloc_conf_removed(paths, dry_run=dry_run)
        for ch in changes:
            print(_diff(ch) if dry_run else f"removed the allocator block from {ch.path}")
        if not changes:
            print("nothing to remove: no gpu-preflight block in " + ", ".join(map(str, paths)))
        return
    with interruptible():
        probe = LocalProbe(cfg.probe.torch_timeout_s)
        facts = probe.machine()
        alloc, notes = _alloc(probe, facts, cfg, dry_run, apply=True)
        results = run_checks(dataclasses.replace(facts, alloc=alloc), cfg, checks=_ALLOC_ONLY)
    for note in notes:
        print(note, end="" if note.endswith("\n") else "\n")
    if not notes:
        print("already in place: " + ", ".join(map(str, paths)))
    report = Report(facts.host.hostname, probe.label, tuple(results))
    _emit(report, "")
    if report.exit_code():
        raise Exit(code=1)


def _alloc_only() -> Any:
    from checks.runner import CHECKS

    return tuple(item for item in CHECKS if item[0] == "alloc-conf")


_ALLOC_ONLY = _alloc_only()

ns = Collection(bootstrap, snapshot, alloc_conf)
ns.configure({"preflight": load_defaults()})
