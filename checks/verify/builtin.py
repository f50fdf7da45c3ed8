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
  line (a setting the user exported is theirs and is kept);
- the flags of the resume replay (``checks/verify/resume.py``): the script keeps the batches of the steps after
  its first save (``--keep-batches``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.bootstrap import AllocEnv, allocator_env
from checks.machine.resources import loader_advice
from checks.verify import distributed
from checks.verify import plan as v
from checks.verify.contract import DataSpec

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
    keep_dir: str  # the resume replay's: the first checkpoint (the script overwrites its file), the batches after it
    first_save: int  # the step of the script's first save under verify (the warm-up's last + 1)

    def describe(self) -> str:
        """The progress line for several processes."""
        backend = "NCCL" if self.gpu else "gloo on the CPU"
        return f"verify: {self.processes} processes, DistributedDataParallel ({backend}) under torchrun"

    def shown(self) -> str:
        """The command as a user would type it from the checkout (the full one is in the report; the resume
        replay's ``--keep-batches DIR --keep-steps N`` left out)."""
        argv = list(self.command[1 + len(self.alloc_given) :] if self.alloc_given else self.command)
        if "--keep-batches" in argv:
            del argv[argv.index("--keep-batches") : argv.index("--keep-batches") + 4]
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
    keep = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-preflight-resume-"))
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
        "--keep-batches", keep, "--keep-steps", str(cfg.resume_steps),
    ]  # fmt: skip
    alloc = allocator_env(facts, config)
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
