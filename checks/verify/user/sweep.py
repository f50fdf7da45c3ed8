"""The batch size of the user's own command, by re-running it: ``--sweep`` to the throughput knee, and the largest
batch that fits when the asked one runs out of memory.

The seed's closing habit (grow the batch until throughput stops rising) on the user's real model and data. The
agent sets ``batch_size`` where each DataLoader is built (every loader of the command, every rank's under
torchrun); each re-run is the command stopped after ``verify.sweep_warmup`` + ``verify.sweep_steps`` optimizer
steps, with the CUDA allocator's peak of each step read on a GPU. The first row is the measured run itself (its
batch and median; no peak: that run leaves torch's peak statistics to the script). The batch doubles until a
doubling gains less than ``1/verify.knee_fraction - 1``, a re-run runs out of memory, ``verify.sweep_max_batch``,
or the next re-run would not end before the budget's deadline (twice the last one's time: ``cut_at``,
``cut_needs_s``). ``measurements.sweep`` has the built-in loop's shape: ``rows`` (``batch``, ``median_step_s``,
``samples_per_s``, ``peak_reserved_bytes``; or ``oom``; or ``error``), ``knee_batch``.

Out of memory at the asked batch (the command crashed with CUDA's ``OutOfMemoryError`` or the host allocator's
failure): the batch is halved until a re-run fits, then bisected a little (three more re-runs at most, as the
built-in loop's search; each the command stopped after one warm-up and one measured step) while the budget's
deadline allows;
``measurements.oom`` is the built-in loop's ``Oom`` record (``batch``, ``message``, ``largest_fit``: 0 when none
fitted or the time ran out before one did; ``memory``: the CUDA allocator's figures of the run that ran out, from
the agent's ``memory`` line at its exit, so the verdict says how full the card was; null on the CPU).

Where the batch size cannot be set (batches built without ``torch.utils.data.DataLoader``, a ``batch_sampler``,
``batch_size=None``, batches whose size cannot be read) the sweep is ``{"skipped": ...}`` saying so, and nothing
is re-run.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checks.config import VerifyConfig
from checks.reports.verify import Oom
from checks.verify.events import LoaderLine
from checks.verify.figures import knee_batch, largest_fit
from checks.verify.user import judge as j
from checks.verify.user.launch import CommandRun, StopRule, run_command

OOM_WORDS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory", "std::bad_alloc")


@dataclass(frozen=True)
class Start:
    """The measured run as the sweep's first row: its loader's batch size, where it is built, its figures."""

    batch: int
    site: str
    median_step_s: float
    samples_per_s: float


def start(lead: j.Rank | None) -> Start | str:
    """The first row, or why the command's batch size cannot be swept (one line)."""
    if lead is None or not lead.steps:
        return "no measured step to start from"
    if lead.loader is None:
        return (
            "the command builds its batches without torch.utils.data.DataLoader, so verify cannot set their size: "
            "sweep with your script's own batch-size flag (one verify -- COMMAND per size)"
        )
    site = lead.loader.site or "?"
    batch = lead.loader.asked.get("batch_size")
    if not isinstance(batch, int) or batch < 1 or lead.loader.batch_size is None:
        return f"the DataLoader at {site} batches with a batch_sampler (or batch_size=None): verify cannot set its size"
    figs = j.rank_figures(lead)
    if figs is None or not figs.fig.samples_per_s:
        return "the size of the command's batches could not be read (no tensor in them): no samples/s to compare"
    return Start(batch, site, figs.fig.median_s, figs.fig.samples_per_s)


def oom(run: CommandRun) -> bool:
    """The re-run ended on an allocation failure (CUDA's or the host's)."""
    return run.ended == "crashed" and any(w in line for line in run.traceback() for w in OOM_WORDS)


def row_of(run: CommandRun, batch: int, warmup: int, steps: int) -> dict[str, Any]:
    """One batch size's row: its median step, samples/s and peak; or ``oom``; or what else ended it."""
    if oom(run):
        return {"batch": batch, "oom": True}
    lead = j.rerun_lead(run, warmup, steps)
    figs = j.rank_figures(lead) if lead else None
    if figs is None or lead is None or len(lead.steps) < steps:
        last = run.traceback()[-1:] if run.ended == "crashed" else []
        why = f"{run.ended} after {len(lead.steps) if lead else 0} measured step(s)" + (f": {last[0]}" if last else "")
        return {"batch": batch, "error": why}
    if lead.loader is not None and lead.loader.batch_size != batch:
        return {"batch": batch, "error": f"the DataLoader was built with batch_size {lead.loader.batch_size}"}
    peaks = [s.peak_bytes for s in lead.steps if s.peak_bytes is not None]
    return {
        "batch": batch,
        "median_step_s": round(figs.fig.median_s, 6),
        "samples_per_s": figs.fig.samples_per_s,
        "peak_reserved_bytes": max(peaks) if peaks else None,
    }


def measure(argv: Sequence[str], cwd: str, first: Start, cfg: VerifyConfig, deadline: float) -> dict[str, Any]:
    """``measurements.sweep`` of the command (see the module docstring); ``deadline``: monotonic seconds."""
    base = {"batch": first.batch, "median_step_s": round(first.median_step_s, 6)}
    rows: list[dict[str, Any]] = [base | {"samples_per_s": first.samples_per_s, "peak_reserved_bytes": None}]
    out: dict[str, Any] = {"site": first.site, "re_runs": 0}
    batch, last_s = first.batch * 2, 0.0
    while batch <= cfg.sweep_max_batch:
        left = deadline - time.monotonic()
        if (last_s and 2 * last_s > left) or left <= 0:
            out |= {"cut_at": batch, "cut_needs_s": round(2 * last_s, 1)}
            break
        rule = StopRule(cfg.sweep_warmup, cfg.sweep_steps, first_step_s=left, stall_s=left, limit_s=left)
        began = time.monotonic()
        run = run_command(argv, rule, cwd, None, subprocess.DEVNULL, {"batch_size": batch}, peak=True)
        last_s = time.monotonic() - began
        out["re_runs"] += 1
        if run.interrupted:
            out["interrupted"] = True
            break
        rows.append(row_of(run, batch, cfg.sweep_warmup, cfg.sweep_steps))
        if "samples_per_s" not in rows[-1] or _flat(rows, cfg.knee_fraction):
            break
        batch *= 2
    return {"rows": rows, "knee_batch": knee_batch(rows, cfg.knee_fraction)} | out


def _flat(rows: list[dict[str, Any]], knee: float) -> bool:
    """The last doubling gained less than 1/knee - 1 (the built-in loop's stop rule)."""
    a, b = rows[-2].get("samples_per_s"), rows[-1].get("samples_per_s")
    return bool(a and b and b < a / knee)


def largest(argv: Sequence[str], cwd: str, run: CommandRun, deadline: float) -> j.OomSearch:
    """Out of memory at the asked batch: the largest that fits (the ``Oom`` record), the DataLoader's site, and
    how many re-runs it took; no record, the reason in place of the site, where the batch cannot be set."""
    loaders = [e for e in run.events if isinstance(e, LoaderLine)]
    if not loaders:
        return j.OomSearch(None, "the command ran out of memory before it built a torch.utils.data.DataLoader", 0)
    loader = loaders[-1]
    asked, site = loader.asked.get("batch_size"), loader.site or "?"
    if not isinstance(asked, int) or asked < 1 or loader.batch_size is None:
        return j.OomSearch(
            None, f"the DataLoader at {site} batches with a batch_sampler: verify cannot set its size", 0
        )
    tries: list[int] = []

    def fits(batch: int) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False  # out of time counts as not known to fit: the answer stays on the safe side
        tries.append(batch)
        rule = StopRule(1, 1, first_step_s=left, stall_s=left, limit_s=left)
        again = run_command(argv, rule, cwd, None, subprocess.DEVNULL, {"batch_size": batch})
        return not oom(again) and again.ended in ("stopped", "exited") and bool(j.ranks(again.events, 1, 1, 0))

    message = next((line for line in reversed(run.traceback()) if any(w in line for w in OOM_WORDS)), "")
    fit = largest_fit(fits, asked)
    memory = j.oom_memory(run.events)  # at the asked batch, as it ran out
    return j.OomSearch(Oom(batch=asked, message=message[:300], largest_fit=fit, memory=memory), site, len(tries))
