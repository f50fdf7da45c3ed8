"""The resume replay of the tool's own script (``templates/train.py``), run after the measured run.

The script's first checkpoint is kept aside the moment it lands (``FirstSave``), and every process keeps the batches
of the steps after that save (``--keep-batches``, ``checks/verify/builtin.py`` gives it). The script is started
again from that file (``--resume``) on those batches (``--replay-batches``): equal losses prove the state the file
holds (model, optimizer, scaler, RNG states, position) whatever the loader draws, which ``verify-checkpoint``
judges; the script also says whether its rebuilt loader drew the same batches (sample order and contents), which
``verify-data-resume`` judges apart: random augmentation in DataLoader workers cannot resume exactly, yet leaves a
correct checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.reports.verify import Checkpoint, DataResume
from checks.result import Result, fail, ok, skip, warn
from checks.verify.builtin import Builtin
from checks.verify.events import Event, Moved, Saved, StepLine
from checks.verify.user.launch import StopRule, run_command

OWN_LINK = "first.pt"  # templates/train.py's link to its first save, beside the batches after it (BatchReplay.saved)


class FirstSave:
    """The first checkpoint file rank 0 saves, kept aside: the script links it beside the batches it keeps after it
    (``OWN_LINK``, right after the save, so always the first), else verify links it (a copy across filesystems) the
    moment the agent says it landed. The script rewrites one file, and its last version is usually the one the stop
    cut short of any step after it. The file says which step it holds, so a later version caught here, when the
    steps outrun the agent's lines, still replays (on the loader's own batches: the kept ones follow the first)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.original, self.caught = folder, "", ""

    @property
    def kept(self) -> str:
        """The file kept aside ("": none)."""
        own = os.path.join(self.folder, OWN_LINK)
        return own if os.path.isfile(own) else self.caught

    def seen(self, e: Saved | Moved) -> None:
        if self.caught or not e.lead:
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
        self.original, self.caught = where, target


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
    fed: bool = False  # the resumed script trained on the first run's kept batches (False: on its loader's own)
    data: DataResume | None = None  # its rebuilt loader's batches against the kept ones (None: none compared)

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
    is a function of the sample and the saved RNG states, gives the same losses (exactly on the CPU). Where every
    process kept the batches of the steps after its first save (``--keep-batches``), the resumed script trains on
    those (``--replay-batches``): its losses judge the checkpoint whatever the loader draws, and it says whether
    its loader drew the same (``Replay.data``). ``saved``: the file's name and what it holds; ``kept``: where the
    file was kept aside (``FirstSave``). None: nothing to compare (no save, or no step after it)."""
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
    # the batches the processes kept follow the first save: a later file FirstSave caught resumes elsewhere
    fed = at == b.first_save and all(os.path.isfile(_batches(b.keep_dir, rank)) for rank in range(b.processes))
    argv = [*b.command, "--resume", kept or path, "--steps", str(at + len(losses)), "--ckpt-dir", ""]
    argv += ["--replay-batches", b.keep_dir] if fed else []
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
            fed,
            same_batches(b) if fed else None,
        )
    return Replay(path, at, tuple(losses), resumed, took, rtol, "", fed, same_batches(b) if fed else None)


def _batches(folder: str, rank: int) -> str:
    """The batches process ``rank`` kept after its first save (``templates/train.py``'s ``BatchReplay``)."""
    return os.path.join(folder, f"batches-{rank}.npz")


def same_batches(b: Builtin) -> DataResume | None:
    """What the resumed script's loader drew against the kept batches, over every process, the micro-batches of
    the steps compared: ``templates/train.py`` writes ``same-RANK.json``, one ``{"indices", "inputs",
    "targets"}`` of booleans a batch. None: a process compared none (its replay ended before its first batch)."""
    per_rank: list[list[dict[str, bool]]] = []
    for rank in range(b.processes):
        try:
            rows = json.loads(Path(b.keep_dir, f"same-{rank}.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rows, list) or not rows:
            return None
        per_rank.append(
            [{k: r.get(k) is True for k in ("indices", "inputs", "targets")} for r in rows if isinstance(r, dict)]
        )
    n = min(len(rows) for rows in per_rank)
    if not n:
        return None
    batches = [{k: all(rows[i][k] for rows in per_rank) for k in ("indices", "inputs", "targets")} for i in range(n)]
    differ = [i for i, same in enumerate(batches) if not all(same.values())]
    workers = b.loader.get("num_workers")
    return DataResume(
        batches=n,
        exact=not differ,
        order_same=all(same["indices"] for same in batches),
        first_difference=differ[0] if differ else None,
        workers=workers if isinstance(workers, int) else 0,
        differs=tuple(part for part in ("inputs", "targets") if not all(same[part] for same in batches)) or None,
    )


FED_FIX = (
    "the resumed script trained on the batches the first run drew after that save, so the state the checkpoint "
    "holds differs from the running one: randomness in the model outside the saved RNG states, a buffer missing "
    "from state_dict (persistent=False), optimizer or scheduler state not saved, or nondeterministic kernels"
)
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
    how = "same batches replayed" if r.fed else "the loader's own batches from the saved position"
    if r.reproduced:
        exact = "exactly" if r.max_rel_diff == 0 else f"within {r.max_rel_diff:.1e}"
        summary = f"resume from step {r.step} reproduces the next {n} steps' loss {exact} ({how}); {cost}"
        return ok("verify-checkpoint", summary, value=timed.save_s if timed else None)
    losses = f"uninterrupted {list(r.uninterrupted)} vs resumed {list(r.resumed)}"
    same = "batches" if r.fed else "samples"
    summary = (
        f"resume from step {r.step} does not reproduce the next {n} steps' loss on the same {same}: {losses}; {cost}"
    )
    return fail("verify-checkpoint", summary, FED_FIX if r.fed else RESUME_FIX, value=timed.save_s if timed else None)


DATA_RESUME_FIX = (
    "seed each sample's random draws from its index and epoch (e.g. a torch.Generator seeded from seed, epoch and "
    "index inside __getitem__) rather than the worker's RNG, or keep the loader's state in the checkpoint and "
    "rebuild the iterator from it (torchdata's StatefulDataLoader)"
)
ONLY_THE_SCRIPT = (
    "checked only for the tool's script (invoke verify without --): it replays its first run's batches after a "
    "resume, which a command's own resume code cannot be made to do; verify-checkpoint says what its file holds"
)


def data_resume_result(b: Builtin | None, r: Replay | None) -> Result:
    """``verify-data-resume``: the loader rebuilt from the saved position yields the batches the first run had
    (sample order and contents). Judged apart from ``verify-checkpoint``: data whose augmentation cannot resume
    exactly leaves a correct checkpoint; it warns, with the cause and the fix."""
    if b is None:
        return skip("verify-data-resume", ONLY_THE_SCRIPT)
    if r is None or not r.fed:
        why = "no resume replayed" if r is None else "the first run's batches were not kept (verify-checkpoint judged"
        why += " the replay on its loader's own batches)" if r is not None else " (verify-checkpoint says why)"
        return skip("verify-data-resume", why)
    d = r.data
    if d is None:
        return skip("verify-data-resume", "the resumed script compared no batch (verify-checkpoint says why)")
    if d.exact:
        summary = f"the loader rebuilt from the saved position yields the next {d.batches} batches bit for bit"
        return ok("verify-data-resume", summary, value=True)
    if not d.order_same:
        summary = (
            f"after a resume the next {d.batches} batches hold other samples: the sample order does not resume (a "
            "sampler without a saved position or epoch, or an unseeded one)"
        )
        return warn("verify-data-resume", summary, "save the sampler's epoch and position and rebuild it from them",
                    value=False)  # fmt: skip
    parts = " and ".join(d.differs or ("inputs",))
    same = f"the same samples in the same order (the sampler resumed), other {parts}"
    if d.workers:
        why = (
            f"{same}: the random transforms run in {d.workers} DataLoader worker(s), whose RNGs are seeded anew when "
            "the loader starts, so no checkpoint restores where they were"
        )
    else:
        why = f"{same}: the dataset draws randomness the checkpoint does not hold (its own generator or OS entropy)"
    summary = f"{why} (the checkpoint itself passed on the first run's batches: verify-checkpoint)"
    return warn("verify-data-resume", summary, DATA_RESUME_FIX, value=False)
