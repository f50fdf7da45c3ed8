"""gpu-preflight tasks: ``invoke bootstrap``, ``invoke snapshot``, ``invoke alloc-conf``.

Thin on purpose: parse flags, build the typed config, call the packages, print, pick the exit code.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import platform
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from invoke import Collection, Context, Program, task
from invoke.exceptions import Exit, ParseError

from checks.config import PreflightConfig, load_defaults, make_config, validate_files
from checks.env_config import check_env_overrides
from checks.errors import ExitStatus, PreflightError, terminate_as_interrupt
from checks.facts import AllocFacts, MachineFacts
from checks.fileio import write_atomic
from checks.fleet.render import render_fleet
from checks.fleet.report import FleetReport, build_fleet_report, host_measurements
from checks.machine.runner import measure, run_checks
from checks.parse_errors import usage_error
from checks.probe import LocalProbe, Probe, SnapshotProbe
from checks.render import render_text, use_colour
from checks.result import Report
from checks.snapshot import dump_snapshot, to_jsonable, write_snapshot
from provision.alloc_env import Change, choose_value, ensure_alloc_conf, ensure_alloc_conf_removed, variables_for
from provision.hosts import HostSpec, select_hosts


def _config_files(argv: list[str], environ: Mapping[str, str]) -> list[Path]:
    """The files Invoke will merge (system, user, project, runtime ``-f``), in its order; .py files are skipped."""
    stems = [Path("/etc/invoke"), Path(os.path.expanduser("~/.invoke")), Path(__file__).resolve().parent / "invoke"]
    files = [stem.with_name(stem.name + ext) for stem in stems for ext in (".yaml", ".yml", ".json")]
    runtime = _runtime_config(argv, environ)
    if runtime is not None and not runtime.exists():  # Invoke would go on without it, and without saying so
        raise PreflightError(
            f"configuration file {runtime} does not exist",
            hint="fix the path given with -f / --config / INVOKE_RUNTIME_CONFIG",
        )
    return files + ([runtime] if runtime else [])


def _runtime_config(argv: list[str], environ: Mapping[str, str]) -> Path | None:
    """The runtime configuration file: the last ``-f``/``--config`` on the command line, else the variable."""
    runtime = environ.get("INVOKE_RUNTIME_CONFIG")
    for i, arg in enumerate(argv):
        if arg in ("-f", "--config") and i + 1 < len(argv):
            runtime = argv[i + 1]
        elif arg.startswith("--config="):
            runtime = arg.split("=", 1)[1]
        elif arg.startswith("-f") and len(arg) > 2:
            runtime = arg[2:]
    return Path(os.path.expanduser(runtime)) if runtime else None


# Before Invoke merges files and casts variables: a bad value is one line and exit 2, not a traceback.
check_env_overrides(os.environ, load_defaults())
validate_files(_config_files(sys.argv, os.environ))


def _flag_errors_exit_2() -> None:
    """Make a bad task flag or flag value one line and exit 2, like every other usage error.

    Invoke 2.2.1's Program.run prints a ParseError and exits 1, and a value its flag cannot cast (--steps abc)
    ends in a ValueError traceback. Invoke imports this file in Program.parse_collection(), before
    Program.parse_tasks() parses the task flags, so wrapping that one method here covers every task. Done once:
    this file can be imported again (tests, a second collection load).
    """
    original = Program.parse_tasks
    if getattr(original, "gpu_preflight", False):
        return

    def parse_tasks(self: Program) -> None:
        try:
            original(self)
        except (ParseError, ValueError) as exc:
            parser = getattr(self, "parser", None)
            error = usage_error(exc, parser.contexts if parser is not None else ())
            if error is None:
                raise
            raise error from None

    setattr(parse_tasks, "gpu_preflight", True)  # noqa: B010 (a marker attribute on a function)
    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]


_flag_errors_exit_2()


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


def _emit(report: Report | FleetReport, json_path: str) -> None:
    """Human text to stdout (stderr when JSON goes to stdout); JSON to a file or stdout."""
    text_stream = sys.stderr if json_path == "-" else sys.stdout
    colour = use_colour(text_stream, os.environ)
    text_stream.write(render_fleet(report, colour) if isinstance(report, FleetReport) else render_text(report, colour))
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
    from checks.machine.resources import loader_advice

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
    out.update(host_measurements(facts))  # disks, mounts, downloads, inventory
    return out


def _finish(report: Report | FleetReport, json_path: str, strict: bool) -> None:
    """Print the report (and its JSON), then exit with the report's code."""
    _emit(report, json_path)
    code = report.exit_code(strict=strict)
    if code:
        raise Exit(code=code)


def _fleet(
    cfg: PreflightConfig, specs: list[HostSpec], source: str, json_path: str, strict: bool, dry_run: bool
) -> None:
    """Bootstrap every host over SSH, measure the links between them, report them together."""
    from provision.fanout import run_fleet  # fabric and paramiko load only for fleet runs

    def notify(line: str) -> None:
        sys.stderr.write(f"gpu-preflight: {line}\n")

    with interruptible(), terminate_as_interrupt():  # SIGTERM/SIGHUP also stop the remote processes
        facts = run_fleet(specs, cfg, Path(__file__).resolve().parent, dry_run, notify, source)
    _finish(build_fleet_report(facts, cfg, platform.node()), json_path, strict or cfg.report.strict)


@task(
    help={
        "json": "also write the JSON report to PATH ('-' for stdout; the text report then goes to stderr)",
        "machine": "judge a machine snapshot FILE instead of this machine (see `invoke snapshot`)",
        "strict": "exit 1 on warnings too",
        "bench": "run the GPU micro-benchmarks (default on; --no-bench skips them)",
        "dry_run": "show what the allocator setting would change in the shell files, write nothing",
        "hosts": "bootstrap these hosts over SSH instead: h1,h2 or user@host:port (~/.ssh/config applies)",
        "hosts_file": "bootstrap the hosts listed in FILE (one per line; DeepSpeed's 'host slots=N' works)",
    }
)
def bootstrap(
    c: Context,
    json: str = "",
    machine: str = "",
    strict: bool = False,
    bench: bool = True,
    dry_run: bool = False,
    hosts: str = "",
    hosts_file: str = "",
) -> None:
    """Check this machine right after renting it: driver, CUDA, torch, GPUs, CPU/RAM/shm, disks, benchmarks."""
    cfg = settings(c)
    _check_output_path(json)
    if not bench:
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, enabled=False))
    specs, source = select_hosts(hosts, hosts_file, os.environ, cfg.hosts.slurm and not machine)
    if specs and machine:
        raise PreflightError("--machine judges a snapshot; it cannot be combined with --hosts or --hosts-file")
    if specs:
        return _fleet(cfg, specs, source, json, strict, dry_run)
    with interruptible(), terminate_as_interrupt():
        probe = _probe(machine, cfg)
        facts = measure(probe, probe.machine(), cfg)
        alloc, notes = _alloc(probe, facts, cfg, dry_run, apply=cfg.alloc_conf.apply)
        facts = dataclasses.replace(facts, alloc=alloc)
        results = run_checks(facts, cfg)
    report = Report(facts.host.hostname, probe.label, tuple(results), _measurements(facts, cfg, notes))
    for note in notes:
        sys.stderr.write(note if note.endswith("\n") else note + "\n")
    _finish(report, json, strict or cfg.report.strict)


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
            facts = measure(probe, facts, cfg)
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
    from checks.machine.runner import CHECKS

    return tuple(item for item in CHECKS if item[0] == "alloc-conf")


_ALLOC_ONLY = _alloc_only()


@task(
    name="stage-data",
    help={
        "source": "folder, CSV/TSV list, .txt/.jsonl, .tar/.tar.gz/.zip, host:/path (rsync over SSH) or http(s) URL",
        "dest": "the staged dataset's own folder (default: <fullest local disk>/staged/<name>)",
        "kind": "images, text or auto (preflight.stage.kind)",
        "format": "npy (one memmap) or pt (torch.load-safe shards)",
        "size": "output side S in pixels (images are S x S x 3)",
        "resize": "crop (shorter side to S, centre crop) or stretch (plain resize)",
        "sha256": "expected sha256 of a downloaded file",
        "max_rejects": "rejected inputs allowed: a count (25) or a fraction (0.1%, 0.001)",
        "workers": "decode processes (default: usable cores less preflight.stage.reserve_cores)",
        "reserve_cores": "usable cores left free while decoding",
        "copy": "copy a local folder to the staging disk with rsync first, instead of reading it in place",
        "field": "JSON field of a .jsonl document's text",
        "tokenizer": "a Hugging Face tokenizer.json (default: byte-level tokens)",
        "token_dtype": "auto, uint16 or uint32",
        "verify": "re-hash the staged dataset DIR and check its shapes against its manifest",
        "progress": "show progress bars even when stderr is not a terminal",
    },
)
def stage_data(
    c: Context,
    source: str = "",
    dest: str = "",
    kind: str = "",
    format: str = "",
    size: int = 0,
    resize: str = "",
    sha256: str = "",
    max_rejects: str = "",
    workers: int = 0,
    reserve_cores: int = -1,
    copy: bool = False,
    field: str = "",
    tokenizer: str = "",
    token_dtype: str = "",
    verify: str = "",
    progress: bool = False,
) -> None:
    """Copy a dataset to local disk and pre-decode it once into memory-mapped arrays (or .pt shards)."""
    import time

    from datasets import options, stage
    from datasets import progress as bars

    cfg = settings(c)
    shown = bars.Bars(sys.stderr) if progress or sys.stderr.isatty() else bars.Silent()
    start = time.monotonic()
    if verify:
        with interruptible():
            problems = stage.verify(Path(verify), shown)
        for line in problems:
            print(f"{verify}: {line}")
        print(
            f"verified {verify}: "
            + (f"{len(problems)} problem(s)" if problems else "hashes and shapes match the manifest")
        )
        if problems:
            raise Exit(code=ExitStatus.PROBLEMS)
        return
    if not source:
        raise PreflightError(
            "stage-data needs --source (or --verify DIR)", hint="e.g. invoke stage-data --source ~/imagenet/train"
        )
    flags = options.Flags(
        source,
        dest,
        kind,
        format,
        size,
        resize,
        sha256,
        max_rejects,
        workers,
        reserve_cores,
        copy,
        field,
        tokenizer,
        token_dtype,
    )
    with interruptible():
        outcome = stage.stage(
            options.build_request(cfg.stage, flags, cfg.disk), progress=shown, say=lambda s: print(s, file=sys.stderr)
        )
    for note in outcome.notes:
        sys.stderr.write(note + "\n")
    print(options.summary(outcome, time.monotonic() - start))


@task(
    help={
        "data": "a staged dataset DIR (invoke stage-data's npy layout); default: synthetic data",
        "steps": "measured steps (default preflight.verify.steps; warm-up steps come first)",
        "batch_size": "batch size per step (default preflight.verify.batch_size_gpu / _cpu)",
        "accum": "gradient-accumulation micro-batches per optimizer step",
        "workers": "DataLoader workers (default: bootstrap's recommendation)",
        "ckpt_dir": "your real checkpoint DIR, to time a save there (default: a temporary directory)",
        "ckpt_every": "steps between checkpoints, to amortise the save (default preflight.verify.checkpoint_every_steps)",
        "price_per_hour": "this machine's price per hour: cost per epoch and per lost share",
        "json": "JSON report PATH ('-' for stdout); the CSV and PNG go beside it (default: preflight.verify.report_dir)",
        "plot": "PNG timeline PATH (default: beside the JSON report)",
        "sweep": "double the batch until OOM or the throughput knee",
        "ab": "also time the model under torch.compile (reduce-overhead on a GPU)",
        "dataset": "your own dataset: MODULE:CALLABLE returning a map-style Dataset of (input, target)",
        "model": "your own model: MODULE:CALLABLE returning an nn.Module",
        "device": "auto, cuda or cpu (default preflight.verify.device)",
    }
)
def verify(
    c: Context,
    data: str = "",
    steps: int = 0,
    batch_size: int = 0,
    accum: int = 0,
    workers: int = -1,
    ckpt_dir: str = "",
    ckpt_every: int = 0,
    price_per_hour: float = 0.0,
    json: str = "",
    plot: str = "",
    sweep: bool = False,
    ab: bool = False,
    dataset: str = "",
    model: str = "",
    device: str = "",
) -> None:
    """Train a few dozen steps as the real run will and say where step time goes: verdict, fix, cost."""
    from contextlib import ExitStack

    from checks.verify import plan as v
    from checks.verify.report import judge
    from checks.verify.results import render_verdicts

    cfg = settings(c)
    opts = v.Options(data, steps, batch_size, accum, workers, ckpt_dir, ckpt_every, price_per_hour, json, plot, sweep, ab, dataset, model, device)  # fmt: skip
    with ExitStack() as stack, interruptible():
        p, facts = v.plan(opts, cfg, LocalProbe(cfg.probe.torch_timeout_s).machine, stack)
        gate = v.gate(facts, cfg)
        outcome = v.run(p, cfg, lambda e: _progress(v.progress(e)))
        v.raise_usage(outcome)
        results, measurements, verdicts = judge(p, outcome, cfg.verify)
        child = outcome.child.result or {}
        title = f"invoke verify: {verdicts[0].id if verdicts else 'cant-tell'}"
        notes = v.write_outputs(
            p.csv_path, p.png_path, outcome.trace, title, outcome.gpu_index, p.usable_cores,
            steps=child.get("steps", []), warmup=child.get("warmup", []),
            shares=measurements.get("step_breakdown"), phases=child.get("timeline"),
        )  # fmt: skip
    report = Report(facts.host.hostname, "live", tuple(gate + results), measurements)
    _emit(report, p.json_path)
    (sys.stderr if p.json_path == "-" else sys.stdout).write(render_verdicts(verdicts))
    for note in [*notes, f"wrote {p.json_path}, {p.csv_path}, {p.png_path}"]:
        sys.stderr.write(note + "\n")
    if outcome.child.interrupted:
        raise Exit("gpu-preflight: interrupted (the partial report is written)", code=ExitStatus.INTERRUPTED)
    code = report.exit_code(strict=cfg.report.strict)
    if code:
        raise Exit(code=code)


def _progress(line: str | None) -> None:
    if line:
        sys.stderr.write(line + "\n")


@task(
    help={
        "seconds": "how long to sample (default preflight.verify.watch_seconds); Ctrl-C stops early",
        "pid": "your training process: its tree's CPU and its GPU are judged (default: the whole machine)",
        "json": "JSON report PATH ('-' for stdout); the CSV and PNG go beside it (default: preflight.verify.report_dir)",
        "plot": "PNG timeline PATH (default: beside the JSON report)",
    }
)
def watch(c: Context, seconds: int = 0, pid: int = 0, json: str = "", plot: str = "") -> None:
    """Sample GPU and CPU use while your own training runs and say which one holds it back."""
    from checks.verify import plan as v
    from checks.verify import watch as w
    from checks.verify.results import render_verdicts

    cfg = settings(c)
    w.check_pid(pid)
    if seconds < 0:
        raise PreflightError(f"--seconds must be positive, got {seconds}")
    json_path, csv, png = v.outputs(json, plot, cfg.verify, "watch")
    usable, host = w.usable_here()
    seconds = seconds or cfg.verify.watch_seconds
    sys.stderr.write(f"watch: sampling for {seconds} s (Ctrl-C stops early)\n")
    watched = w.sample(seconds, pid or None, usable, cfg.verify)
    found = w.verdicts(watched, cfg.verify, usable)
    results, measurements = w.results(watched, found, usable, str(csv))
    measurements["files"] = {"json": json_path, "csv": str(csv), "png": str(png)}
    notes = v.write_outputs(csv, png, watched.trace, f"invoke watch: {found[0].id}", watched.gpu, usable)
    _emit(Report(host, "live", tuple(results), measurements), json_path)
    (sys.stderr if json_path == "-" else sys.stdout).write(render_verdicts(found))
    for note in [*notes, f"wrote {json_path}, {csv}, {png}"]:
        sys.stderr.write(note + "\n")
    if watched.interrupted:
        raise Exit("gpu-preflight: interrupted (the partial report is written)", code=ExitStatus.INTERRUPTED)


ns = Collection(bootstrap, snapshot, alloc_conf, stage_data, verify, watch)
ns.configure({"preflight": load_defaults()})
