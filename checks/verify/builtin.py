"""``invoke verify`` without ``--``: the training script the tool ships, run as ``verify -- COMMAND`` runs any.

``invoke verify [flags]`` is ``invoke verify -- python templates/train.py <flags>`` (``torchrun`` for several
processes): the same launcher, agent, events and judge as the user's own command. What this module adds is what
only the tool knows about its own script, all parent side and before anything starts:

- the flags and ``preflight.verify`` settings turned into the script's flags (one meaning per key: the size of the
  synthetic images, the batch per device, the workers bootstrap recommends, the checkpoint cadence);
- the refusals that must come before training (exit 2): a broken staged folder, a raw image folder, an unwritable
  ``--ckpt-dir``;
- the ``verify-data`` row's description of the data, and whether an epoch has a size to price (synthetic data has
  none: it is generated on demand);
- the allocator setting bootstrap writes for new shells, given to the script as ``env NAME=VALUE`` on its command
  line (a setting the user exported is theirs and is kept).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.bootstrap import AllocEnv, allocator_env
from checks.machine.resources import loader_advice
from checks.reports.verify import Checkpoint
from checks.result import Result, fail, ok
from checks.verify import distributed
from checks.verify import plan as v
from checks.verify.contract import DataSpec
from checks.verify.events import Event, Moved, Saved, StepLine
from checks.verify.user.launch import StopRule, run_command

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "train.py"
# The test checkpoint's file name: never a name the real run's files may have (the script's own default is last.pt),
# so that --ckpt-dir can name the real run's folder; removed after the run (and the resume replay from it).
CKPT_NAME = "gpu-preflight-verify.pt"
# The script's own step count: more than any verify measures, so that verify's stop rule ends it (after warm-up +
# --steps, once the shares are stable, or when the budget is spent) and every re-run alike, never the script first.
UNTIL_STOPPED = 1_000_000


@dataclass(frozen=True)
class Builtin:
    """The tool's own script as a command, and what the judge says of it beyond what the agent measures."""

    command: tuple[str, ...]
    data: DataSpec | None  # None: the user's --dataset (the agent describes it)
    loader: dict[str, object]  # the DataLoader settings the script is given
    loader_note: str  # why they differ from bootstrap's advice
    ckpt_dir: str
    ckpt_temporary: bool
    alloc: AllocEnv
    alloc_given: tuple[str, ...]  # the variables set on the command line (the others: the user's own export)
    processes: int
    device: str  # auto, cuda or cpu as configured: a cpu run is not gated by the GPU side
    gpu: bool  # the script trains on the GPU (--device cuda)
    ckpt_every: int  # the real run's save interval, over which the save timed under verify is amortised
    keep_dir: str  # where the first checkpoint is kept for the resume replay (the script overwrites its file)
    first_save: int  # the step of the script's first save under verify (the warm-up's last + 1)

    def describe(self) -> str:
        """The progress line for several processes."""
        backend = "NCCL" if self.gpu else "gloo on the CPU"
        return f"verify: {self.processes} processes, DistributedDataParallel ({backend}) under torchrun"

    def shown(self) -> str:
        """The command as a user would type it from the checkout (the full one is in the report)."""
        argv = list(self.command[1 + len(self.alloc_given) :] if self.alloc_given else self.command)
        argv[0] = "torchrun" if self.processes > 1 else "python"
        if self.processes > 1:
            del argv[1:3]  # -m torch.distributed.run
        return shlex.join(os.path.relpath(a, TEMPLATE.parents[1]) if a == str(TEMPLATE) else a for a in argv)

    @property
    def epoch_samples(self) -> int | None:
        """A staged dataset's samples (the epoch ``verify-cost`` prices); synthetic data has no epoch."""
        return self.data.samples if self.data is not None and self.data.source == "staged" else None

    def data_line(self, dataset: str | None, samples: int | None) -> str:
        """``verify-data``: what was read and through which DataLoader settings."""
        if self.data is not None:
            what = self.data.describe()
        else:
            what = f"your dataset {dataset or '?'}" + (f" ({samples:,} samples)" if samples else "")
        settings = ", ".join(f"{k}={v}" for k, v in self.loader.items())
        return f"{what}; DataLoader({settings})" + (f" ({self.loader_note})" if self.loader_note else "")

    def allocator(self) -> str:
        """The allocator setting the script trained with: bootstrap's (as new shells get it) or the user's own."""
        if not self.alloc.variables:
            return self.alloc.describe()
        kept = [f"{k} from your environment" for k in self.alloc.variables if k not in self.alloc_given]
        given = [f"{k}={v}" for k, v in self.alloc.variables.items() if k in self.alloc_given]
        return ", ".join(given + kept) + (" (as bootstrap writes it for new shells)" if given else "")


def prepare(
    opts: v.Options, config: PreflightConfig, machine: Callable[[], MachineFacts], stack: ExitStack, warmup: int
) -> tuple[Builtin, MachineFacts]:
    """Validate the flags (exit 2 before the machine is read or anything runs) and build the script's command.
    ``warmup``: the steps verify leaves out; the script saves right after them, then as often, so that a save is
    timed among the measured steps (the report amortises it over ``checkpoint_every_steps``)."""
    cfg = v.effective(config.verify, opts)
    data = v.data_spec(opts, cfg)
    ckpt, temporary = v.checkpoint_dir(opts, cfg, stack)
    if not temporary:  # before the folders verify made for it are removed (the stack unwinds last in, first out)
        stack.callback(remove_test_checkpoint, ckpt)
    facts = machine()
    local = distributed.processes(opts.nproc, cfg, facts)
    loader = loader_advice(facts, config).as_dict()
    workers, note = v.workers_for(opts, cfg, data)
    if workers < 0:
        advised = loader.get("num_workers")
        workers = advised if isinstance(advised, int) else 0
    loader = {"num_workers": workers, "persistent_workers": workers > 0, "prefetch_factor": 2 if workers else None}
    first_save = min(warmup + 1, cfg.checkpoint_every_steps)
    gpu = cfg.device == "cuda" or (cfg.device == "auto" and facts.torch.device_count > 0)
    batch = opts.batch_size or (cfg.batch_size_gpu if gpu else cfg.batch_size_cpu)
    if data is None:
        source = []
    elif data.source == "staged":
        source = ["--data", data.path]
    else:
        source = ["--data", f"synthetic-{data.kind}"]
    flags = [
        *source,
        *(["--dataset", opts.dataset] if opts.dataset else []),
        *(["--model", opts.model] if opts.model else []),
        "--size", cfg.model_size, "--image-size", str(cfg.image_size), "--classes", str(cfg.classes),
        "--seq-len", str(cfg.seq_len), "--batch-size", str(batch), "--accum", str(cfg.accum),
        "--workers", str(workers), "--precision", cfg.precision, "--device", "cuda" if gpu else "cpu",
        "--lr", repr(cfg.lr), "--seed", str(cfg.seed), "--ckpt-dir", ckpt, "--ckpt-name", CKPT_NAME,
        "--ckpt-every", str(first_save), "--steps", str(UNTIL_STOPPED),
    ]  # fmt: skip
    alloc = allocator_env(facts, config)
    keep = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-preflight-resume-"))
    given = tuple(k for k in alloc.variables if k not in os.environ)
    prefix = ["env", *(f"{k}={alloc.variables[k]}" for k in given)] if given else []
    if local > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={local}"]
    else:
        launcher = [sys.executable]
    command = (*prefix, *launcher, str(TEMPLATE), *flags)
    return Builtin(
        command,
        data,
        loader,
        note,
        ckpt,
        temporary,
        alloc,
        given,
        local,
        cfg.device,
        gpu,
        cfg.checkpoint_every_steps,
        keep,
        first_save,
    ), facts


def remove_test_checkpoint(folder: str) -> None:
    """The script's test checkpoint in the asked folder, and the partial file a save cut short leaves: gone."""
    for name in (CKPT_NAME, f".{CKPT_NAME}.partial"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))


class FirstSave:
    """The first checkpoint file rank 0 saves, kept aside the moment the agent says it landed (a hard link, else a
    copy): the script rewrites one file, and its last version is usually the one the stop cut short of any step
    after it. The file says which step it holds, so a later version caught here is as good."""

    def __init__(self, folder: str) -> None:
        self.folder, self.original, self.kept = folder, "", ""

    def seen(self, e: Saved | Moved) -> None:
        if self.kept or not e.lead:
            return
        where = e.to if isinstance(e, Moved) else e.path
        if os.path.basename(where).startswith("."):  # a temporary name: wait
            return
        target = os.path.join(self.folder, os.path.basename(where))
        try:
            os.link(where, target)
        except OSError:
            try:
                shutil.copyfile(where, target)
            except OSError:
                return
        self.original, self.kept = where, target


@dataclass(frozen=True)
class Replay:
    """The resume replay: the losses of the steps after the last save, uninterrupted and resumed from it."""

    path: str
    step: int
    uninterrupted: tuple[float, ...]
    resumed: tuple[float, ...]
    seconds: float
    rtol: float  # preflight.verify.resume_rtol: how far a resumed loss may be from the uninterrupted one
    error: str = ""  # why it could not be compared ("" when it was)

    @property
    def reproduced(self) -> bool | None:
        return None if self.error else self.max_rel_diff <= self.rtol

    @property
    def max_rel_diff(self) -> float:
        pairs = zip(self.uninterrupted, self.resumed, strict=True)
        return max((abs(a - b) / max(abs(a), 1e-12) for a, b in pairs), default=0.0)


def replay(
    b: Builtin, saved: tuple[str, dict[str, Any]] | None, events: Sequence[Event], pid: int, cwd: str,
    steps: int, seconds: float, rtol: float, kept: str = "",
) -> Replay | None:  # fmt: skip
    """Resume the script from the last checkpoint it saved (``--resume FILE``, the same flags) for up to ``steps``
    steps and compare their losses with the steps the measured run took after that save: the resumed script draws
    the same samples (the sampler's position is in the file), so a checkpoint that holds everything, on data that
    is a function of the sample and the saved RNG states, gives the same losses (exactly on the CPU). ``saved``:
    the file's name and
    what it holds; ``kept``: where the file was kept aside (``FirstSave``). None: nothing to compare (no save, or
    no step after it)."""
    if saved is None or seconds <= 0:
        return None
    path, contents = saved
    at = (contents.get("position") or {}).get("step")
    if not isinstance(at, (int, float)):
        return None
    at = int(at)
    after = [e for e in events if isinstance(e, StepLine) and e.pid == pid]
    losses = [e.loss for e in sorted(after, key=lambda e: e.i) if e.i > at and e.loss is not None]
    losses = losses[:steps]
    if not losses:
        return None
    argv = [*b.command, "--resume", kept or path, "--steps", str(at + len(losses)), "--ckpt-dir", ""]
    rule = StopRule(warmup=1, steps=len(losses), limit_s=seconds, first_step_s=seconds, stall_s=seconds)
    started = time.monotonic()
    run = run_command(argv, rule, cwd, None, subprocess.DEVNULL)
    took = time.monotonic() - started
    lead = [e for e in run.events if isinstance(e, StepLine) and e.lead and e.loss is not None]
    resumed = tuple(e.loss for e in sorted(lead, key=lambda e: e.i) if e.loss is not None)[: len(losses)]
    if len(resumed) < len(losses):
        why = "the resumed run " + ("ran out of time" if run.ended == "limit" else f"ended ({run.ended})")
        last = run.traceback()
        return Replay(
            path,
            at,
            tuple(losses),
            resumed,
            took,
            rtol,
            f"{why} after {len(resumed)} step(s){': ' + last[-1] if last else ''}",
        )
    return Replay(path, at, tuple(losses), resumed, took, rtol)


RESUME_FIX = (
    "the resumed script drew the same samples from the position the file holds, so something the checkpoint does "
    "not restore differs: in the model, randomness outside the saved RNG states, a buffer missing from state_dict "
    "(persistent=False), optimizer or scheduler state not saved, or nondeterministic kernels; in the data, random "
    "augmentation in DataLoader workers (their RNGs are seeded when the loader starts, and no checkpoint holds "
    "them: seed each sample's draws from its index and epoch), or draws from the OS entropy pool or an unseeded "
    "generator"
)


def resume_result(b: Builtin, r: Replay, timed: Checkpoint | None) -> Result:
    """``verify-checkpoint`` of the tool's script: the resume replay's verdict and what a save costs."""
    where = "a temporary directory (pass --ckpt-dir to time your real one)" if b.ckpt_temporary else b.ckpt_dir
    cost = f"to {where}"
    if timed is not None and timed.save_s:
        mb = (timed.bytes or 0) / 1e6
        cost = f"save {timed.save_s:.2f} s ({mb:.0f} MB, {mb / timed.save_s:.0f} MB/s) {cost}"
    n = len(r.uninterrupted)
    if r.error:
        return fail("verify-checkpoint", f"resuming from {r.path} (step {r.step}) failed: {r.error}; {cost}",
                    "run templates/train.py --resume FILE alone to see why", value="resume-failed")  # fmt: skip
    if r.reproduced:
        exact = "exactly" if r.max_rel_diff == 0 else f"within {r.max_rel_diff:.1e}"
        summary = (
            f"resume from step {r.step} reproduces the next {n} steps' loss {exact} (same batches replayed); {cost}"
        )
        return ok("verify-checkpoint", summary, value=timed.save_s if timed else None)
    losses = f"uninterrupted {list(r.uninterrupted)} vs resumed {list(r.resumed)}"
    summary = (
        f"resume from step {r.step} does not reproduce the next {n} steps' loss on the same samples: {losses}; {cost}"
    )
    return fail("verify-checkpoint", summary, RESUME_FIX, value=timed.save_s if timed else None)
