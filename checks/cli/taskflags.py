"""Every task's flags: one frozen dataclass per task, a field per flag (see ``checks/cli/flags.py`` for how a field
becomes a flag). A flag that means the same in several tasks is declared once, in a class those tasks inherit.

To add a flag to a task: add a field to its class here and read it in the task (``tasks.py``); where the package's
request has a field of the same name, ``checks.cli.flags.fill`` copies it over.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from checks.cli.flags import command, flag
from checks.config import VerifyConfig
from checks.errors import PreflightError

JSON_TEXT = "also write the JSON report to PATH ('-' for stdout; the text then goes to stderr)"

# --- flags that several tasks share (a task's own flags get their short flags first, then these) ----------


@dataclass(frozen=True)
class Machine:
    machine: str = flag("", "a machine snapshot FILE (see `invoke snapshot`) that stands for this machine")


@dataclass(frozen=True)
class DryRun:
    dry_run: bool = flag(False, "show what the allocator setting would change in the shell files, write nothing")


@dataclass(frozen=True)
class Hosts:
    hosts: str = flag("", "run on these hosts over SSH instead: h1,h2 or user@host:port (~/.ssh/config applies; verify: DDP, rank 0 on the first)")  # fmt: skip
    hosts_file: str = flag("", "run on the hosts listed in FILE (one per line; DeepSpeed's 'host slots=N' works and sets verify's ranks)")  # fmt: skip


@dataclass(frozen=True)
class EveryRow:
    all: bool = flag(False, "print every row: each skip, and in verify bootstrap's ok checks too (by default only what needs a look)")  # fmt: skip


@dataclass(frozen=True)
class Outputs:
    json: str = flag("", "JSON report PATH ('-' for stdout); the CSV and PNG go beside it (default: preflight.verify.report_dir)")  # fmt: skip
    plot: str = flag("", "PNG timeline PATH (default: beside the JSON report)")


# --- bootstrap, snapshot, alloc-conf ------------------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    """bootstrap's Slurm hook mode; last among bootstrap's bases, so the older flags keep their short letters."""

    hook: bool = flag(False, "Slurm Prolog/Epilog/HealthCheckProgram mode: fast checks only; exit 1 with one reason line if unhealthy")  # fmt: skip
    drain: bool = flag(False, "with --hook: drain this node when unhealthy, resume it when healthy if gpu-preflight drained it; under srun: drain the job's failing nodes")  # fmt: skip
    expect_gpus: int = flag(-1, "with --hook: the GPUs this node must have (0: a CPU node; default: the gpu count of its Gres in Slurm)")  # fmt: skip


@dataclass(frozen=True)
class Strict:
    """bootstrap's and verify's exit rule; last among their bases, so the older flags keep their short letters."""

    strict: bool = flag(False, "exit 1 on warnings too (default preflight.report.strict)")


@dataclass(frozen=True)
class BootstrapFlags(Machine, DryRun, Hosts, EveryRow, Hook, Strict):
    json: str = flag("", JSON_TEXT)
    bench: bool = flag(True, "run the GPU micro-benchmarks (default on; --no-bench skips them)")
    lock: str = flag("", "also check this box (with --hosts: each host) against a lock FILE (invoke lock): every pin at its version")  # fmt: skip
    install: bool = flag(False, "with --hosts: install the dependencies into a virtualenv next to each host's checkout first")  # fmt: skip


@dataclass(frozen=True)
class SnapshotFlags:
    out: str = flag("", "snapshot FILE to write (JSON; share it to reproduce a report anywhere)")
    description: str = flag("", "free text stored in the snapshot: what this machine is")
    bench: bool = flag(False, "also run and record the GPU micro-benchmarks (and PCIe links under load)")


@dataclass(frozen=True)
class AllocConfFlags(DryRun):
    undo: bool = flag(False, "remove the block gpu-preflight wrote")


# --- stage-data ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageFlags:
    source: str = flag("", "folder, CSV/TSV list, .txt/.jsonl, .tar/.tar.gz/.zip, host:/path (rsync over SSH) or http(s) URL")  # fmt: skip
    dest: str = flag("", "the staged dataset's own folder (default: <fastest local disk with room>/staged/<name>)")
    kind: str = flag("", "images, text or auto (preflight.stage.kind)")
    format: str = flag("", "npy (one memmap) or pt (torch.load-safe shards)")
    size: int = flag(0, "output side S in pixels (images are S x S x 3; 0: preflight.stage.size)")
    resize: str = flag("", "crop (shorter side to S, centre crop) or stretch (plain resize)")
    sha256: str = flag("", "expected sha256 of a downloaded file")
    max_rejects: str = flag("", "rejected inputs allowed: a count (25) or a fraction (0.1%, 0.001)")
    workers: int = flag(0, "decode processes (0: usable cores less preflight.stage.reserve_cores)")
    reserve_cores: int = flag(-1, "usable cores left free while decoding")
    copy: bool = flag(False, "copy a local folder to the staging disk with rsync first, instead of reading it in place")
    field: str = flag("", "JSON field of a .jsonl document's text")
    tokenizer: str = flag("", "a Hugging Face tokenizer.json (default: byte-level tokens)")
    token_dtype: str = flag("", "auto, uint16 or uint32")
    verify: str = flag("", "re-hash the staged dataset DIR and check its shapes against its manifest")
    progress: bool = flag(False, "show progress bars even when stderr is not a terminal")


# --- verify and watch ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """The flags that shape how a run is measured (once only for `verify -- COMMAND`, now for every single-box run);
    last among verify's bases, so the older flags keep their letters."""

    warmup: int = flag(-1, "optimizer steps left out before measuring (-1: preflight.verify.warmup; not with --hosts)")
    seconds: float = flag(0.0, "measure for this many seconds instead of --steps (0: count steps; not with --hosts)")
    quiet: bool = flag(False, "hide the training script's (or your command's) own output (not with --hosts)")


@dataclass(frozen=True)
class VerifyFlags(Outputs, EveryRow, Hosts, Command, Strict):
    data: str = flag("", "a staged dataset DIR (invoke stage-data's npy layout); default: synthetic data")
    steps: int = flag(0, "measured steps (0: preflight.verify.steps; warm-up steps come first)")
    batch_size: int = flag(0, "batch size per step (0: preflight.verify.batch_size_gpu / _cpu)")
    accum: int = flag(0, "gradient-accumulation micro-batches per optimizer step (0: preflight.verify.accum)")
    workers: int = flag(-1, "DataLoader workers (default: bootstrap's recommendation)")
    ckpt_dir: str = flag("", "your real checkpoint DIR, to time a save there (default: a temporary directory)")
    ckpt_every: int = flag(0, "steps between checkpoints, to amortise the save (0: preflight.verify.checkpoint_every_steps)")  # fmt: skip
    price_per_hour: float = flag(
        0.0, "this machine's price per hour: cost per epoch and per lost share (0: preflight.verify.price_per_hour)"
    )
    sweep: bool = flag(False, "re-run at doubling batch sizes until OOM or the throughput knee")
    ab: bool = flag(False, "also time the model under torch.compile, by a re-run (when the run is compute-bound)")
    dataset: str = flag("", "your own dataset: MODULE:CALLABLE returning a map-style Dataset of (input, target)")
    model: str = flag("", "your own model: MODULE:CALLABLE returning an nn.Module")
    device: str = flag("", "auto, cuda or cpu (default preflight.verify.device)")
    nproc: int = flag(
        0,
        "processes, DistributedDataParallel (0: preflight.verify.nproc, every visible GPU when two or more; CPU: gloo)",
    )
    budget: str = flag(
        "",
        "wall SECONDS for the whole command (default preflight.verify.budget): measuring stops once the shares are "
        "stable or the rest would not fit; what is cut is named",
    )  # text, not a number: a typed 0 is refused (exit 2), never read as "the default"
    command: tuple[str, ...] = command()  # invoke verify [flags] -- COMMAND [ARGS...]


@dataclass(frozen=True)
class WatchFlags(Outputs):
    seconds: int = flag(0, "how long to sample (0: preflight.verify.watch_seconds); Ctrl-C stops early")
    pid: int = flag(0, "your training process: its tree's CPU and its GPU are judged (default: the whole machine)")


# --- diff and lock ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffFlags:
    a: str | None = flag(None, "the box that worked: a snapshot, a bootstrap --json report, or live")
    b: str | None = flag(None, "the box to judge: a snapshot, a bootstrap --json report, or live (this box)")
    json: str = flag("", JSON_TEXT)
    all: bool = flag(False, "a line for every differing package (default: what training stands on; others counted)")


@dataclass(frozen=True)
class LockFlags:
    out: str = flag("", "lock FILE to write (a pip requirements file with a header naming this box)")
    all: bool = flag(False, "pin every installed distribution, not only preflight.env.packages and what they require")


# --- sbatch -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SbatchFlags:
    nodes: int = flag(2, "nodes of the job (at least 1)")
    gpus_per_node: int = flag(8, "GPUs per node, and torchrun's processes per node (0: a job without GPUs, one process)")  # fmt: skip
    time: str = flag("00:30:00", "the job's time limit (sbatch --time: MM, HH:MM:SS or D-HH:MM:SS)")
    partition: str = flag("", "sbatch --partition (default: the cluster's)")
    account: str = flag("", "sbatch --account (default: yours)")
    out: str = flag("", "write the script to FILE instead of printing it")
    command: tuple[str, ...] = command()


# --- plan ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanFlags(Machine):
    model: str = flag("", "your model: MODULE:CALLABLE returning an nn.Module (built on the meta device, nothing allocated)")  # fmt: skip
    input_shape: str = flag("", "one sample's input shape for --model, e.g. 3x224x224 or 512 (token ids with --input-dtype long)")  # fmt: skip
    input_dtype: str = flag("float", "float or long (token ids)")
    dataset: str = flag("", "MODULE:CALLABLE of your dataset: its first item's input gives the shape and dtype")
    hf_config: str = flag("", "a local config.json of a transformers model (nothing is downloaded)")
    params: str = flag("", "analytic model size: 7B, 1.3e9, 350M (with --layers --hidden --heads --seq --vocab)")
    layers: int = flag(0, "transformer layers (analytic form)")
    hidden: int = flag(0, "hidden size (analytic form)")
    heads: int = flag(0, "attention heads (analytic form)")
    seq: int = flag(0, "sequence length (analytic form; overrides --hf-config's max_position_embeddings)")
    vocab: int = flag(0, "vocabulary size (analytic form): the logits")
    method: str = flag("full", "full, lora or qlora")
    optimizer: str = flag("adamw", "adamw, sgd or adam8bit")
    precision: str = flag("mixed", "mixed (16-bit compute, fp32 master), bf16 (all 16-bit) or fp32")
    lora_rank: int = flag(0, "LoRA rank (0: preflight.plan.lora_rank)")
    batch_size: int = flag(1, "micro-batch per GPU that must fit (default 1)")
    gpus: int = flag(0, "GPUs per option (0: the fewest that fit)")
    sharding: str = flag("auto", "auto, ddp, zero1, zero2, zero3 or fsdp")
    checkpointing: bool = flag(False, "activation checkpointing of the model's blocks")
    attention: str = flag("flash", "flash (fused kernels, as on a GPU) or as-written")
    from_: str = flag("", "a verify JSON report of this model: step time and cost per card")
    epoch_samples: int = flag(0, "samples in one epoch (the cost per epoch; else per million samples)")
    json: str = flag("", JSON_TEXT)


COMMAND_FLAGS = frozenset(f.name for f in dataclasses.fields(Command)) | {
    "strict",
    "steps",
    "budget",
    "price_per_hour",
    "all",
    "json",
    "plot",
    "sweep",
    "ab",
}


def command_only_flags(f: VerifyFlags) -> list[str]:
    """The ``-- COMMAND`` flags given without a command: the tool's own script has no use for them (refused, not
    ignored)."""
    given = [x for x in dataclasses.fields(Command) if getattr(f, x.name) != x.default]
    return ["--" + x.name.replace("_", "-") for x in given]


def own_loop_flags(f: VerifyFlags) -> list[str]:
    """The verify flags given (not at their default) that shape verify's own loop, which ``-- COMMAND`` does not run."""
    given = [x for x in dataclasses.fields(f) if "help" in x.metadata and getattr(f, x.name) != x.default]
    return ["--" + x.name.replace("_", "-") for x in given if x.name not in COMMAND_FLAGS]


# --- verify's steps against the child's hard limit ------------------------------------------------------------

# A step under verify costs at least its bookkeeping, one JSON event a step: about 100 µs of CPU for the agent of
# `-- COMMAND` (docs/verify.md, "Overhead", measured in BENCHMARKS.md's "verify -- COMMAND overhead"). More steps
# than verify.timeout_s holds at that pace cannot end: refused. The pace of real steps is known only after the
# warm-up, so fewer get a note, not a refusal.
STEP_FLOOR_S = 100e-6
# Fewer seconds a step than this left by verify.timeout_s gets a note: a step of a second is ordinary (the built-in
# CNN on 224 px photos takes 4.9 s a step on a 2-core box, docs/verify.md#time-to-verdict). Tool-defined.
NOTE_STEP_S = 1.0
_RAISE = "raise preflight.verify.timeout_s in invoke.yaml or with INVOKE_PREFLIGHT_VERIFY_TIMEOUT_S=SECONDS"


def _pace(seconds: float) -> str:
    return f"{seconds * 1000:.2g} ms" if seconds < 0.01 else f"{seconds:.2g} s"


def timeout_note(f: VerifyFlags, cfg: VerifyConfig) -> str | None:
    """Check ``--steps`` / ``--seconds`` against ``verify.timeout_s``, after which the training child is killed.

    Refuse what cannot end before it (``--seconds`` at or past it; more steps than it holds at ``STEP_FLOOR_S``
    each); return a note when the steps leave less than ``NOTE_STEP_S`` a step, else None.
    """
    limit = f"preflight.verify.timeout_s ({cfg.timeout_s:g} s)"
    if f.command and f.seconds >= cfg.timeout_s:
        hint = f"ask for fewer seconds, or {_RAISE}"
        raise PreflightError(f"verify --seconds {f.seconds:g} cannot end before {limit} kills the command", hint=hint)
    if f.steps <= 0:
        return None
    warmup = f.warmup if f.warmup >= 0 else cfg.warmup
    each = cfg.timeout_s / (f.steps + warmup)
    if each < STEP_FLOOR_S:
        why = f"kills the training child, even at {_pace(STEP_FLOOR_S)} a step, verify's own bookkeeping"
        raise PreflightError(
            f"verify --steps {f.steps} cannot end before {limit} {why}", hint=f"ask for fewer, or {_RAISE}"
        )
    if each >= NOTE_STEP_S:
        return None
    return (
        f"verify: --steps {f.steps} and {warmup} warm-up steps must end within {limit}, start-up included, or the "
        f"training child is killed: at most {_pace(each)} a step; for slower steps {_RAISE}"
    )
