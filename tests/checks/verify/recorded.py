"""A run the built-in loop's child recorded (a ``ChildResult``: the GPU traces of ``tests/fixtures/traces``, the CPU
runs of ``runs/``) as the ``verify -- COMMAND`` run the agent would have written for the same steps: the events a
``CommandRun`` holds, for the command's judge (``checks/verify/user/judge.py``).

Each process says ``hello`` and ``torch``, its ``device`` (torch's index on a GPU), the ``loader`` it built (the
child's DataLoader keywords, its batch size, the dataset's length) and, where the child counted them, the ``flops``
of one step; then one ``step`` line per warm-up and measured step with the fields the judge reads (``ranks``,
``step_record``, ``rank_figures``, ``rank_rows``): the five phases, host times, ``enqueue_s``, the ``fetch``
windows, ``loss``, ``micro``/``batches`` (the accumulation), ``samples`` (and ``tokens`` for token ids),
``feed``, ``saves``/``checkpoint``/``ckpt_bytes``, ``precision``, ``pid`` and the rank fields.

The child timed ``h2d`` apart, as a script that marks its copies with the agent's ``region("h2d")`` does; its
timed checkpoint save is one save in the last measured step (amortised over ``Setting.ckpt_every``, as the tool's
own script under verify is). Several ranks (``ChildResult.ranks``) are one process each; only rank 0's warm-up
was recorded, so every rank gets its copy (the ranks step together under DDP). On a GPU, the child's kernel
profile (``ChildResult.kernels``) is the agent's ``kernels`` line after the profiled warm-up step's line, and its
allocator figures (``ChildResult.memory``) the ``memory`` line the agent writes at exit (also after an
out-of-memory error before any step); both rank 0's (the only process the child read them in). What the child
measured and no agent line carries is left out: the DataLoader timed alone, the sample's cost split, the no_sync
A/B, the resume replay, torch.compile's A/B.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from checks.verify.contract import ChildResult, RankDevice, Step
from checks.verify.events import Event, parse
from checks.verify.user.launch import CommandRun

# A DataLoader's attributes the agent reads, at torch's defaults (prefetch_factor: 2 with workers, else None)
LOADER_DEFAULTS: dict[str, Any] = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
FEED = "data:1"  # the agent's key of the DataLoader's dataset (any string, the same in the step and loader lines)
PID = 4000  # the first process's id; rank r is PID + r, torchrun's own process PID - 1


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A recorded run as a command run, and the stop rule's warm-up and steps the judge splits its steps by."""

    run: CommandRun
    warmup: int
    steps: int


@dataclasses.dataclass(frozen=True)
class _Process:
    pid: int
    rank: int | None
    world: int | None
    device: dict[str, Any]
    warmup: tuple[Step, ...]
    steps: tuple[Step, ...]


def recorded(
    r: ChildResult,
    argv: Sequence[str] = ("python", "train.py"),
    *,
    ended: str = "stopped",
    returncode: int | None = -2,
    seconds: float = 0.0,
    stderr: Sequence[str] = (),
    asked_steps: int | None = None,
    tokens_per_sample: int = 0,
) -> Recorded:
    """``r`` as a command run that ``ended`` as said (``stopped`` by verify after its steps, as a measured run
    is); ``asked_steps``: the stop rule's steps where the run ended before them (default: those recorded);
    ``tokens_per_sample``: a token model's sequence length (each sample's token ids)."""
    events = [parsed(e) for e in _events(r, tokens_per_sample)]
    stopped = ended in ("stopped", "interrupted", "stalled")
    signals = {"stopped": ["SIGINT"], "interrupted": ["SIGINT"], "stalled": ["SIGINT", "SIGTERM", "SIGKILL"]}
    run = CommandRun(
        argv=tuple(argv),
        events=events,
        returncode=returncode,
        ended=ended,
        stop_reason="steps" if ended == "stopped" else "",
        stopped_by_verify=stopped,
        interrupted=ended == "interrupted",
        signals=signals.get(ended, []),
        stderr_tail=list(stderr),
        seconds=seconds,
        pids={e.pid for e in events},
    )
    return Recorded(run, len(r.warmup), len(r.steps) if asked_steps is None else asked_steps)


def parsed(line: dict[str, Any]) -> Event:
    """An agent line as the launcher reads it, strictly (a key its record does not name fails the test); ``t``
    0 where the line leaves it out."""
    event = parse({"t": 0.0, **line}, strict=True)
    assert event is not None
    return event


def _events(r: ChildResult, tokens_per_sample: int) -> list[dict[str, Any]]:
    """Every process's lines, process by process (the judge reads them by pid and rank, not by order)."""
    processes = _processes(r)
    events: list[dict[str, Any]] = []
    if len(processes) > 1:  # torchrun's own process imports torch too (its hello has no rank)
        events += _start(r, PID - 1, _ids(None, None))
    for p in processes:
        events += _process_events(r, p, tokens_per_sample)
    return events


def _processes(r: ChildResult) -> list[_Process]:
    device = r.device.to_json() if r.device is not None else {"type": "cpu", "name": "CPU", "uuid": None}
    one = {"type": device["type"], "name": device["name"] if device["type"] == "cuda" else "CPU"}
    one |= {"uuid": device.get("uuid"), **({"index": 0} if device["type"] == "cuda" else {})}
    if not r.ranks:
        return [_Process(PID, None, None, one, r.warmup, r.steps)]
    world = len(r.ranks)
    return [_Process(PID + k.rank, k.rank, world, _rank_device(one, k.device), r.warmup, k.steps) for k in r.ranks]


def _rank_device(base: dict[str, Any], d: RankDevice | None) -> dict[str, Any]:
    if d is None or d.type != "cuda":
        return {"type": "cpu", "name": "CPU", "uuid": None}
    return base | {"uuid": d.uuid, "index": d.index}


def _ids(rank: int | None, world: int | None) -> dict[str, Any]:
    """The rank fields of every agent line (torchrun's environment; None for a process without one)."""
    return {"rank": rank, "local_rank": rank, "world_size": world, "local_world_size": world}


def _start(r: ChildResult, pid: int, ids: dict[str, Any], t: float = 0.0) -> list[dict[str, Any]]:
    hello = {"event": "hello", "t": t, "pid": pid, "argv": ["train.py"], "ppid": 1, "pgid": pid, "main": True, **ids}
    torch = {"event": "torch", "t": t, "pid": pid, "version": r.torch or "2.8.0"}
    return [hello, torch]


def _process_events(r: ChildResult, p: _Process, tokens_per_sample: int) -> list[dict[str, Any]]:
    ids = _ids(p.rank, p.world)
    first = (p.warmup or p.steps or (Step(0, 0, 0, 0, 0),))[0].host_start
    out = _start(r, p.pid, ids, first)
    if r.loader is not None:  # the DataLoader is built before the first step
        settings = LOADER_DEFAULTS | {k: r.loader[k] for k in LOADER_DEFAULTS if r.loader.get(k) is not None}
        settings["prefetch_factor"] = r.loader.get("prefetch_factor") or (2 if settings["num_workers"] else None)
        samples = r.data.samples if r.data else None  # the dataset's len
        out.append({
            "event": "loader", "t": first, "pid": p.pid, "feed": FEED, "dataset": _dataset(r), "samples": samples,
            "batch_size": r.batch_size, "settings": settings, "asked": settings | {"batch_size": r.batch_size},
            "site": "train.py:40", **ids,
        })  # fmt: skip
    lead = p.rank in (None, 0) and p.device["type"] == "cuda"  # the process the child read the GPU figures in
    if not (p.warmup or p.steps):
        return out + (_memory(r, p, ids, first) if lead else [])
    out.append({"event": "device", "t": first, "pid": p.pid, **p.device, **ids})
    if r.flops_per_step:  # the agent counts the last warm-up step
        at = max(1, len(p.warmup))
        out.append({"event": "flops", "t": first, "pid": p.pid, "step": at, "flops": r.flops_per_step, "missed": 0,
                    **ids})  # fmt: skip
    if r.ddp is not None and p.rank is not None:  # at DDP's first forward: the agent's comm hook registered
        out.append({"event": "ddp", "t": first, "pid": p.pid, "backend": r.ddp.backend, "hooked": True, **ids})
    ckpt = r.checkpoint if p.rank in (None, 0) else None  # rank 0 saves
    save = (ckpt.save_s or 0.0, ckpt.bytes or 0) if ckpt is not None else (0.0, 0)
    records = [*p.warmup, *p.steps]
    profiled = max(1, len(p.warmup) - 1)  # the agent profiles the warm-up step before the counted one
    for i, s in enumerate(records, 1):
        last = i == len(records) and bool(p.steps)
        out.append(_step(r, s, i, p, ids, tokens_per_sample, *(save if last else (0.0, 0))))
        if lead and r.kernels is not None and i == profiled:
            out.append({"event": "kernels", "t": s.host_end, "pid": p.pid, "step": i, **r.kernels, **ids})
    return out + (_memory(r, p, ids, records[-1].host_end) if lead else [])


def _memory(r: ChildResult, p: _Process, ids: dict[str, Any], t: float) -> list[dict[str, Any]]:
    """The agent's ``memory`` line at exit (the allocator's figures), where the child read them."""
    if r.memory is None:
        return []
    return [{"event": "memory", "t": t, "pid": p.pid, **r.memory, "step": len(p.warmup) + len(p.steps), "at": "exit",
             **ids}]  # fmt: skip


def _dataset(r: ChildResult) -> str:
    """The dataset's class name, as the agent's loader line has it."""
    reader = (r.data.reader if r.data else None) or "Dataset"
    return reader.rsplit(".", 1)[-1]


def _step(
    r: ChildResult,
    s: Step,
    i: int,
    p: _Process,
    ids: dict[str, Any],
    tokens_per_sample: int,
    save_s: float,
    save_bytes: int,
) -> dict[str, Any]:
    """One step line, as the agent's ``_Steps.record`` writes it."""
    accum = r.accum or 1
    samples = (r.batch_size or 0) * accum
    return {
        "event": "step",
        "t": s.host_end,
        "pid": p.pid,
        "i": i,
        "data_wait": s.data_wait,
        "h2d": s.h2d,
        "forward": s.forward,
        "backward": s.backward,
        "optimizer": s.optimizer,
        "checkpoint": save_s,
        "forward_explicit": 0.0,
        "other_loaders": 0,
        "host_start": s.host_start,
        "host_end": s.host_end,
        "enqueue_s": s.enqueue_s,
        "fetch": [list(w) for w in s.fetch],
        "loss": None if math.isnan(s.loss) else s.loss,
        "micro": accum,
        "batches": accum,
        "samples": samples,
        "tokens": samples * tokens_per_sample,
        "feed": FEED if r.loader is not None else None,
        "saves": 1 if save_s else 0,
        "ckpt_bytes": save_bytes,
        "clock": "cuda-events" if p.device["type"] == "cuda" else "monotonic",
        "precision": r.precision,
        "comm_exposed": None,  # the child timed the exchange by its no_sync A/B, not by a comm hook
        "comm_bytes": None,
        "peak_bytes": None,
        **ids,
    }
