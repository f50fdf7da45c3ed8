"""gpu-preflight tasks: ``invoke bootstrap``, ``snapshot``, ``alloc-conf``, ``stage-data``, ``verify``, ``watch``.

The CLI only: each task turns its flags into a request built with keywords, calls one function of a package,
prints what comes back and picks the exit code. The checks of flags and configuration run inside Invoke's
program when it reaches them (``checks/cli.py``); importing this file only defines the tasks.
"""

from __future__ import annotations

import dataclasses
import json as jsonlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Collection, Context, task
from invoke.exceptions import Exit
from invoke.main import program

from checks import cli
from checks.config import PreflightConfig, load_defaults, make_config
from checks.errors import ExitStatus, PreflightError, terminate_as_interrupt
from checks.fileio import write_atomic
from checks.fleet import run as fleet_run
from checks.fleet.render import render_fleet
from checks.fleet.report import FleetReport
from checks.machine import bootstrap as bootstrap_run
from checks.machine.runner import Check, SnapshotRequest, record_snapshot
from checks.render import render_text, use_colour
from checks.result import Report
from provision.alloc_env import diff
from provision.hosts import select_hosts

if TYPE_CHECKING:
    from checks.verify.run import Judged

CHECKOUT = Path(__file__).resolve().parent


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


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def _emit(report: Report | FleetReport, json_path: str, **shown: Any) -> None:
    """Human text to stdout (stderr when JSON goes to stdout); JSON to a file or stdout. ``shown``: which rows
    the text gives in full (render_text's every_row, background, focus)."""
    text_stream = sys.stderr if json_path == "-" else sys.stdout
    colour = use_colour(text_stream, os.environ)
    text = render_fleet(report, colour) if isinstance(report, FleetReport) else render_text(report, colour, **shown)
    text_stream.write(text)
    if not json_path:
        return
    payload = jsonlib.dumps(report.to_json(), indent=2) + "\n"
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


def _finish(report: Report | FleetReport, json_path: str, strict: bool, every_row: bool = False) -> None:
    """Print the report (and its JSON), then exit with the report's code."""
    _emit(report, json_path, **({"every_row": True} if every_row and isinstance(report, Report) else {}))
    code = report.exit_code(strict=strict)
    if code:
        raise Exit(code=code)


@task(
    help={
        "json": "also write the JSON report to PATH ('-' for stdout; the text report then goes to stderr)",
        "machine": "judge a machine snapshot FILE instead of this machine (see `invoke snapshot`)",
        "strict": "exit 1 on warnings too",
        "bench": "run the GPU micro-benchmarks (default on; --no-bench skips them)",
        "dry_run": "show what the allocator setting would change in the shell files, write nothing",
        "hosts": "bootstrap these hosts over SSH instead: h1,h2 or user@host:port (~/.ssh/config applies)",
        "hosts_file": "bootstrap the hosts listed in FILE (one per line; DeepSpeed's 'host slots=N' works)",
        "lock": "also check this box (with --hosts: each host) against a lock FILE (invoke lock): every pin at its version",
        "install": "with --hosts: install the dependencies into a virtualenv next to each host's checkout first",
        "all": "print every row: each skip too (by default skips sharing a reason are one line)",
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
    lock: str = "",
    install: bool = False,
    all: bool = False,
) -> None:
    """Check this machine right after renting it: driver, CUDA, torch, GPUs, CPU/RAM/shm, disks, benchmarks."""
    cfg = settings(c)
    _check_output_path(json)
    if not bench:
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, enabled=False))
    if install:
        cfg = dataclasses.replace(cfg, hosts=dataclasses.replace(cfg.hosts, install=True))
    specs, source = select_hosts(hosts, hosts_file, os.environ, cfg.hosts.slurm and not machine)
    if specs and machine:
        raise PreflightError("--machine judges a snapshot; it cannot be combined with --hosts or --hosts-file")
    strict = strict or cfg.report.strict
    if specs:
        fleet = fleet_run.FleetRequest(
            config=cfg,
            hosts=tuple(specs),
            source=source,
            checkout=CHECKOUT,
            dry_run=dry_run,
            lock=_lock_text(lock, cfg),
        )
        with interruptible(), terminate_as_interrupt():  # SIGTERM/SIGHUP also stop the remote processes
            report = fleet_run.fleet(fleet, notify=lambda line: _say(f"gpu-preflight: {line}"))
        return _finish(report, json, strict)
    request = bootstrap_run.BootstrapRequest(
        config=cfg, machine=Path(machine) if machine else None, dry_run=dry_run, extra_checks=_lock_checks(lock, cfg)
    )
    with interruptible(), terminate_as_interrupt():
        done = bootstrap_run.bootstrap(request)
    for note in done.notes:  # the diffs end in a newline already
        sys.stderr.write(note if note.endswith("\n") else note + "\n")
    _finish(done.report, json, strict, every_row=all)


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
    request = SnapshotRequest(config=settings(c), out=Path(out), description=description, bench=bench)
    with interruptible():
        facts = record_snapshot(request)
    gpus = len(facts.nvml.gpus)
    print(f"wrote {out}: {gpus} GPU(s), torch {facts.torch.version or 'missing'}, host {facts.host.hostname}")


@task(
    name="alloc-conf",
    help={"dry_run": "show the change, write nothing", "undo": "remove the block gpu-preflight wrote"},
)
def alloc_conf(c: Context, dry_run: bool = False, undo: bool = False) -> None:
    """Write PYTORCH_CUDA_ALLOC_CONF into the shell start-up files and prove a fresh shell's torch reads it."""
    request = bootstrap_run.AllocConfRequest(config=settings(c), dry_run=dry_run, undo=undo)
    with interruptible():
        done = bootstrap_run.alloc_conf(request)
    paths = ", ".join(map(str, done.paths))
    for change in done.changes:
        print(diff(change) if dry_run else f"removed the allocator block from {change.path}")
    for note in done.notes:
        print(note, end="" if note.endswith("\n") else "\n")
    if done.report is None:
        if not done.changes:
            print("nothing to remove: no gpu-preflight block in " + paths)
        return
    if not done.notes:
        print("already in place: " + paths)
    _emit(done.report, "")
    if done.report.exit_code():
        raise Exit(code=1)


@task(
    name="stage-data",
    help={
        "source": "folder, CSV/TSV list, .txt/.jsonl, .tar/.tar.gz/.zip, host:/path (rsync over SSH) or http(s) URL",
        "dest": "the staged dataset's own folder (default: <fastest local disk with room>/staged/<name>)",
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
    from datasets import options, stage, words
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
            + (words.count(len(problems), "problem") if problems else "hashes and shapes match the manifest")
        )
        if problems:
            raise Exit(code=ExitStatus.PROBLEMS)
        return
    if not source:
        raise PreflightError(
            "stage-data needs --source (or --verify DIR)", hint="e.g. invoke stage-data --source ~/imagenet/train"
        )
    flags = options.Flags(
        source=source,
        dest=dest,
        kind=kind,
        format=format,
        size=size,
        resize=resize,
        sha256=sha256,
        max_rejects=max_rejects,
        workers=workers,
        reserve_cores=reserve_cores,
        copy=copy,
        field=field,
        tokenizer=tokenizer,
        token_dtype=token_dtype,
    )
    with interruptible():
        outcome = stage.stage(
            options.build_request(cfg.stage, flags, cfg.disk), progress=shown, say=lambda s: print(s, file=sys.stderr)
        )
    for note in outcome.notes:
        _say(note)
    print(options.summary(outcome, time.monotonic() - start))


def _show_judged(judged: Judged, every_row: bool = False) -> None:
    """Print verify's or watch's report and verdicts and the files written; exit 130 when Ctrl-C cut it short.

    bootstrap's own rows (the gate) show only when they need a look, unless ``every_row``."""
    from checks.verify.results import render_verdicts

    shown = {"every_row": every_row, "background": judged.background, "focus": judged.focus}
    _emit(judged.report, judged.json_path, **shown)
    (sys.stderr if judged.json_path == "-" else sys.stdout).write(render_verdicts(list(judged.verdicts)))
    for note in judged.notes:
        _say(note)
    if judged.interrupted:
        raise Exit("gpu-preflight: interrupted (the partial report is written)", code=ExitStatus.INTERRUPTED)


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
        "nproc": "processes, DistributedDataParallel (default: every visible GPU when two or more; CPU: gloo)",
        "all": "print every row, bootstrap's ok and skipped checks too (by default only those that need a look)",
        "hosts": "train across these hosts over SSH (DDP, rank 0 on the first): h1,h2 or user@host:port",
        "hosts_file": "train across the hosts listed in FILE (one per line; 'host slots=N' sets its ranks)",
        "warmup": "with -- COMMAND: optimizer steps left out before measuring (default preflight.verify.warmup)",
        "seconds": "with -- COMMAND: measure for this many seconds instead of --steps",
        "quiet": "with -- COMMAND: hide the command's own output",
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
    nproc: int = 0,
    all: bool = False,
    hosts: str = "",
    hosts_file: str = "",
    warmup: int = -1,
    seconds: float = 0.0,
    quiet: bool = False,
) -> None:
    """Train a few dozen steps as the real run will and say where step time goes: verdict, fix, cost.

    With ``-- COMMAND [ARGS...]``, run and judge your own training command, unchanged.
    """
    from checks.verify import run as run_verify
    from checks.verify.plan import Options

    cfg = settings(c)
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []  # until the cli branch passes it
    if command:
        from checks.verify.user.run import CommandRequest, verify_command

        ask = CommandRequest(cfg, tuple(command), steps, warmup, seconds, json, plot, price_per_hour, quiet)
        with interruptible(), terminate_as_interrupt():
            judged = verify_command(dataclasses.replace(ask, echo=sys.stderr.buffer), say=_say)
        _show_judged(judged, every_row=all)
        if code := judged.report.exit_code(strict=cfg.report.strict):
            raise Exit(code=code)
        return
    options = Options(
        data=data,
        steps=steps,
        batch_size=batch_size,
        accum=accum,
        workers=workers,
        ckpt_dir=ckpt_dir,
        ckpt_every=ckpt_every,
        price_per_hour=price_per_hour,
        json=json,
        plot=plot,
        sweep=sweep,
        ab=ab,
        dataset=dataset,
        model=model,
        device=device,
        nproc=nproc,
    )
    request = run_verify.VerifyRequest(config=cfg, options=options)
    specs, source = select_hosts(hosts, hosts_file, os.environ, cfg.hosts.slurm)
    if specs and nproc:
        raise PreflightError("--nproc is per box; with --hosts each host runs one rank per GPU (slots=N caps it)")
    with interruptible(), terminate_as_interrupt():
        if specs:
            from checks.verify.hosts import verify_hosts

            judged = verify_hosts(request, specs, source, CHECKOUT, _say)
        else:
            judged = run_verify.verify(request, say=_say)
    _show_judged(judged, every_row=all)
    code = judged.report.exit_code(strict=cfg.report.strict)
    if code:
        raise Exit(code=code)


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
    from checks.verify import run as run_verify

    request = run_verify.WatchRequest(config=settings(c), seconds=seconds, pid=pid, json=json, plot=plot)
    _show_judged(run_verify.watch(request, say=_say))  # no exit code of its own: watch advises


ns = Collection(bootstrap, snapshot, alloc_conf, stage_data, verify, watch)
ns.configure({"preflight": load_defaults()})
cli.adopt(program)  # the program running this file checks flags and configuration as it reaches them


# --- the software environment (checks/env/): invoke diff, invoke lock, bootstrap --lock ------------------------


def _lock_checks(path: str, cfg: PreflightConfig) -> tuple[tuple[str, Check], ...]:
    """bootstrap's env-lock check for --lock FILE (else preflight.env.lock); the file is parsed before the run."""
    from checks.env.lock import lock_check, read_lock

    chosen = path or cfg.env.lock
    return (("env-lock", lock_check(read_lock(Path(chosen).expanduser()))),) if chosen else ()


def _lock_text(path: str, cfg: PreflightConfig) -> str:
    """The text of --lock FILE (else preflight.env.lock) for --hosts, checked here first; "" when none."""
    from checks.env.lock import read_lock

    chosen = Path(path or cfg.env.lock).expanduser() if path or cfg.env.lock else None
    return read_lock(chosen).path.read_text(encoding="utf-8") if chosen else ""


@task(
    name="diff",
    positional=["a", "b"],
    help={
        "a": "the box that worked: a snapshot, a bootstrap --json report, or live",
        "b": "the box to judge: a snapshot, a bootstrap --json report, or live (this box)",
        "json": "also write the JSON diff to PATH ('-' for stdout; the text then goes to stderr)",
    },
)
def env_diff(c: Context, a: str | None = None, b: str | None = None, json: str = "") -> None:
    """Say what differs between two boxes, ranked break / slow / info; exit 1 when something breaks training."""
    from checks.env.diff import diff as diff_sides
    from checks.env.diff import render_diff
    from checks.env.view import load_side
    from checks.probe import LocalProbe

    cfg = settings(c)
    if not a:
        raise PreflightError("diff needs A", hint="e.g. invoke diff worked.json live")
    live = LocalProbe(cfg.probe.torch_timeout_s, cfg.env.nvcc_timeout_s).machine
    with interruptible():
        result = diff_sides(load_side(a, live), load_side(b or "live", live))
    (sys.stderr if json == "-" else sys.stdout).write(render_diff(result))
    if json:
        payload = jsonlib.dumps(result.to_json(), indent=2) + "\n"
        sys.stdout.write(payload) if json == "-" else write_atomic(Path(json), payload)
    if result.exit_code():
        raise Exit(code=result.exit_code())


@task(
    name="lock",
    help={
        "out": "lock FILE to write (a pip requirements file with a header naming this box)",
        "all": "pin every installed distribution, not only preflight.env.packages and what they require",
    },
)
def env_lock(c: Context, out: str = "", all: bool = False) -> None:
    """Write the exact pins of this training environment (torch with its wheel index) to a lock file."""
    from checks.env.lock import LockRequest, make_lock

    if not out:
        raise PreflightError("lock needs --out FILE", hint="e.g. invoke lock --out env.lock")
    with interruptible():
        _, pins = make_lock(LockRequest(config=settings(c), out=Path(out), everything=all))
    print(f"wrote {out}: {len(pins)} pins; check a box with `invoke bootstrap --lock {out}`")


ns.add_task(env_diff)
ns.add_task(env_lock)


# --- invoke plan (checks/plan/): which card, how many, what an epoch costs -------------------------------------


@task(
    name="plan",
    help={
        "model": "your model: MODULE:CALLABLE returning an nn.Module (built on the meta device, nothing allocated)",
        "input_shape": "one sample's input shape for --model, e.g. 3x224x224 or 512 (token ids with --input-dtype long)",
        "input_dtype": "float or long (token ids)",
        "dataset": "MODULE:CALLABLE of your dataset: its first item's input gives the shape and dtype",
        "hf_config": "a local config.json of a transformers model (nothing is downloaded)",
        "params": "analytic model size: 7B, 1.3e9, 350M (with --layers --hidden --heads --seq --vocab)",
        "layers": "transformer layers (analytic form)",
        "hidden": "hidden size (analytic form)",
        "heads": "attention heads (analytic form)",
        "seq": "sequence length (analytic form; overrides --hf-config's max_position_embeddings)",
        "vocab": "vocabulary size (analytic form): the logits",
        "method": "full, lora or qlora",
        "optimizer": "adamw, sgd or adam8bit",
        "precision": "mixed (16-bit compute, fp32 master), bf16 (all 16-bit) or fp32",
        "lora_rank": "LoRA rank (default preflight.plan.lora_rank)",
        "batch_size": "micro-batch per GPU that must fit (default 1)",
        "gpus": "GPUs per option (default: the fewest that fit)",
        "sharding": "auto, ddp, zero1, zero2, zero3 or fsdp",
        "checkpointing": "activation checkpointing of the model's blocks",
        "attention": "flash (fused kernels, as on a GPU) or as-written",
        "from_": "a verify JSON report of this model: step time and cost per card",
        "epoch_samples": "samples in one epoch (the cost per epoch; else per million samples)",
        "machine": "a snapshot FILE whose GPU stands for this box",
        "json": "also write the plan as JSON to PATH ('-' for stdout)",
    },
)
def plan(
    c: Context,
    model: str = "",
    input_shape: str = "",
    input_dtype: str = "float",
    dataset: str = "",
    hf_config: str = "",
    params: str = "",
    layers: int = 0,
    hidden: int = 0,
    heads: int = 0,
    seq: int = 0,
    vocab: int = 0,
    method: str = "full",
    optimizer: str = "adamw",
    precision: str = "mixed",
    lora_rank: int = 0,
    batch_size: int = 1,
    gpus: int = 0,
    sharding: str = "auto",
    checkpointing: bool = False,
    attention: str = "flash",
    from_: str = "",
    epoch_samples: int = 0,
    machine: str = "",
    json: str = "",
) -> None:
    """Say which card, how many and what an epoch costs for a model: memory term by term, per card class."""
    from checks.plan.box import this_box
    from checks.plan.render import render_plan
    from checks.plan.request import PlanRequest
    from checks.plan.run import plan as make_plan

    request = PlanRequest(
        config=settings(c),
        model=model,
        input_shape=input_shape,
        input_dtype=input_dtype,
        dataset=dataset,
        hf_config=hf_config,
        params=params,
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq=seq,
        vocab=vocab,
        method=method,
        optimizer=optimizer,
        precision=precision,
        lora_rank=lora_rank,
        batch_size=batch_size,
        gpus=gpus,
        sharding=sharding,
        checkpointing=checkpointing,
        attention=attention,
        from_report=from_,
        epoch_samples=epoch_samples,
        machine=machine,
        json=json,
    )
    if json and json != "-":
        _check_output_path(json)
    box, ram = this_box(Path(machine) if machine else None)
    with interruptible():
        result = make_plan(request, box=box, ram_bytes=ram)
    (sys.stderr if json == "-" else sys.stdout).write(render_plan(result))
    if json:
        payload = jsonlib.dumps(result.to_json(), indent=2) + "\n"
        sys.stdout.write(payload) if json == "-" else write_atomic(Path(json), payload)


ns.add_task(plan)
