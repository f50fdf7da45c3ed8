"""DDP's scaling efficiency of a torchrun command: one re-run of it as a single process (the solo leg).

The leg is the user's torchrun command with its node flags replaced by ``--standalone --nproc-per-node=1``
(world size 1, the same script, arguments and per-rank batch), stopped after ``RERUN_WARMUP`` and ``RERUN_STEPS``
steps, output hidden, within what the budget leaves of ``verify.command_advice_s``. Its samples/s is
``measurements.ddp.samples_per_s_one``; ``scaling_efficiency`` is the N ranks' samples/s over N times it (1.0:
every rank as fast as one process alone; the exchange, a straggler and the ranks sharing the box's cores and
links take it down). Where the leg cannot apply or did not measure, ``scaling_note`` says why in one line.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Sequence

from checks.reports.verify import DdpFigures
from checks.verify import torchrun
from checks.verify.user import judge as j
from checks.verify.user.exchange import RERUN_STEPS, RERUN_WARMUP
from checks.verify.user.launch import StopRule, run_command

ONE = ["--standalone", "--nproc-per-node=1"]


@dataclasses.dataclass(frozen=True)
class Solo:
    """The solo leg: its samples/s (None where it did not measure) or why not, its argv and seconds."""

    samples_per_s: float | None
    note: str | None = None
    argv: tuple[str, ...] = ()
    seconds: float = 0.0
    interrupted: bool = False


def solo_argv(argv: Sequence[str]) -> list[str] | str:
    """The command as one process under torchrun, or why it cannot be (a launcher other than torchrun). A leading
    ``env NAME=VALUE ...`` (the tool's script sets the allocator so) stays in front."""
    parts = torchrun.parse(argv)
    if parts == torchrun.NOT_TORCHRUN:
        return "the command is not torchrun or python -m torch.distributed.run: verify cannot run it as one process"
    if isinstance(parts, str):
        return "no training script after torchrun's flags"
    return [*parts.prefix, *parts.head, *ONE, *parts.flags, *parts.program]


def measure(argv: Sequence[str], cwd: str, seconds: float) -> Solo:
    """Run the solo leg within ``seconds``; its rank's samples/s over the measured steps."""
    one = solo_argv(argv)
    if isinstance(one, str):
        return Solo(None, one)
    if seconds <= 1.0:
        return Solo(None, "no time left in the budget for a one-process run", tuple(one))
    start = time.monotonic()
    rule = StopRule(RERUN_WARMUP, RERUN_STEPS, first_step_s=seconds, stall_s=seconds, limit_s=seconds)
    run = run_command(one, rule, cwd, None, subprocess.DEVNULL)
    took = round(time.monotonic() - start, 1)
    lead = j.rerun_lead(run, RERUN_WARMUP, RERUN_STEPS)
    figs = j.rank_figures(lead) if lead is not None and len(lead.steps) >= RERUN_STEPS else None
    rate = figs.fig.samples_per_s if figs is not None else None
    if rate:
        return Solo(rate, None, tuple(one), took, run.interrupted)
    why = "it was interrupted" if run.interrupted else f"it {run.ended} before {RERUN_WARMUP + RERUN_STEPS} steps"
    return Solo(None, f"the one-process run did not measure: {why}", tuple(one), took, run.interrupted)


def scaled(d: DdpFigures, samples_per_s: float | None, solo: Solo) -> DdpFigures:
    """``d`` with the N ranks' samples/s (``samples_per_s``, all ranks together), one process's and the scaling
    efficiency, or the note that says why there is none."""
    if not solo.samples_per_s or not samples_per_s:
        note = solo.note or "the ranks' samples/s was not measured (no samples per step seen)"
        return dataclasses.replace(d, samples_per_s=samples_per_s, scaling_note=note)
    eff = samples_per_s / (d.world_size * solo.samples_per_s)
    return dataclasses.replace(
        d,
        samples_per_s=round(samples_per_s, 3),
        samples_per_s_one=round(solo.samples_per_s, 3),
        scaling_efficiency=round(eff, 4),
    )
