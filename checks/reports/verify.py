"""The ``measurements`` of verify's JSON report as typed records: one definition for its writer
(``checks.verify``: both forms judge into ``Measurements``) and its readers (``plan --from``, and any program that
reads a verify report back). Standard library and the core only: verify's training child imports the records its
result shares with the report (``Device``, ``ModelInfo``, ``DataInfo``, ``Checkpoint``, ``Oom``, ``HostRanks``)
through ``checks.verify.contract``.

``Measurements.to_json`` is the one place the keys are written (docs/formats.md lists them;
``tests/checks/verify/verify_report.schema.json`` holds them) and ``Measurements.from_json`` the one place they are
read: it inverts ``to_json`` exactly (the step figures and a command's per-step figures sit at the top level, and a
figure left out when empty reads back as None), and rejects a missing key, an unknown key or a value of the wrong
type with a ``ContractError`` naming the path. Its parts: ``RunFacts`` (``run``), ``StepBlock``
(``step_breakdown``, ``step_time``: ``StepTime``, the rates, ``enqueue_ratio``), ``Mfu``, ``Files``, under several
processes ``DdpFigures`` (``ddp``: ``RankRow`` per rank, ``CommFigures`` for the no_sync A/B, ``HostRanks`` with
--hosts), and for ``verify -- COMMAND`` ``CommandFacts``, ``CommandStep`` and ``ProcessFigures``; the sampler,
cost, upgrade and diagnosis blocks are JSON objects built by ``checks.verify.sampler.summarise``, ``cost.cost``,
``diagnosis.upgrade_bound`` and ``report.diagnosis_rows``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from checks.typedjson import ContractError, JsonObject, Record, TypedJsonError, dump, load_record


@dataclass(frozen=True)
class Device(Record):
    """The device a process trained on (``total_memory`` on a GPU only)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"total_memory"})
    type: str  # "cuda" | "cpu"
    name: str
    uuid: str | None = None
    capability: tuple[int, ...] | None = None
    total_memory: int | None = None


@dataclass(frozen=True)
class ModelInfo(Record):
    name: str
    parameters: int
    user: bool = False  # the user's --model


@dataclass(frozen=True)
class DataInfo(Record):
    """What the child trained on: a ``DataSpec``'s fields (built-in data) or the user's dataset (``kind`` "user",
    ``source`` the --dataset reference, and ``seq_len`` when its items are token windows), and the reader class."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"kind", "source", "samples", "path", "image_size", "classes", "seq_len", "vocab", "reader"}
    )
    kind: str | None = None  # "images" | "tokens" | "user"
    source: str | None = None
    samples: int | None = None
    path: str | None = None
    image_size: int | None = None
    classes: int | None = None
    seq_len: int | None = None
    vocab: int | None = None
    reader: str | None = None


@dataclass(frozen=True)
class DataResume(Record):
    """The tool's script's loader, rebuilt from the saved position, against the batches its first run kept
    (``checks/verify/resume.py``'s ``same_batches``)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"differs"})
    batches: int
    exact: bool
    order_same: bool  # the samplers yielded the same sample indices (older results: the targets agreed)
    first_difference: int | None = None
    workers: int = 0
    differs: tuple[str, ...] | None = None  # "inputs", "targets": the parts that differ in some batch


@dataclass(frozen=True)
class Checkpoint(Record):
    """``measurements.checkpoint``: a save's cost, and for the tool's own script the round trip's verdict (only
    ``error`` when it failed); for a command, the script's own saves during the measured steps (``every_steps``,
    ``saves``: a save's ``save_s`` and ``bytes`` are their means)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"save_s", "bytes", "dir", "load_s", "reproduced", "uninterrupted", "resumed", "max_rel_diff", "data", "error"}
        | {"every_steps", "saves", "file", "contents"}
    )
    save_s: float | None = None
    bytes: int | None = None
    every_steps: float | None = None  # a command: its own saves, one every this many measured steps
    saves: int | None = None  # a command: how many saves the measured steps held
    file: str | None = None  # a command: the last file it saved with torch.save, read back after the run
    contents: JsonObject | None = None  # what that file holds (checks/verify/user/saved.py), or {"error": ...}
    dir: str | None = None
    load_s: float | None = None
    reproduced: bool | None = None
    uninterrupted: tuple[float, ...] | None = None
    resumed: tuple[float, ...] | None = None
    max_rel_diff: float | None = None
    data: DataResume | None = None
    error: str | None = None


@dataclass(frozen=True)
class Oom(Record):
    """Out of memory at ``batch``: the allocator's figures then, and the largest batch that fitted."""

    batch: int
    message: str
    largest_fit: int
    memory: JsonObject | None = None


@dataclass(frozen=True)
class HostRanks(Record):
    """--hosts: which global ranks ran on ``host`` (``address`` as SSH reached it)."""

    host: str
    address: str | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RunFacts(Record):
    """``measurements.run``: what ran, how long, and how it ended."""

    device: Device | None
    precision: str | None
    batch_size: int | None
    accum: int | None
    model: ModelInfo | None
    data: DataInfo | None
    torch: str | None
    threads: int | None
    seconds: float
    interrupted: bool
    failure: str | None
    error: str | None


@dataclass(frozen=True)
class StepTime(Record):
    """``measurements.step_time``: seconds per optimizer step over the measured steps."""

    steps: int
    median_s: float
    p95_s: float
    mean_s: float


@dataclass(frozen=True)
class StepBlock:
    """The figures of the measured steps (present together, or not at all when no step was measured)."""

    step_breakdown: dict[str, float]
    step_time: StepTime
    samples_per_s: float | None
    tokens_per_s: float | None
    samples_per_s_with_checkpoints: float | None
    tokens_per_s_with_checkpoints: float | None
    enqueue_ratio: float | None


@dataclass(frozen=True)
class Mfu(Record):
    """``measurements.mfu``: model FLOPs utilisation against this card's dense datasheet peak (or why not)."""

    value: float | None
    note: str
    peak_tflops: float | None


@dataclass(frozen=True)
class Files(Record):
    """``measurements.files``: where the report, the sampler CSV and the PNG went."""

    json: str
    csv: str
    png: str


@dataclass(frozen=True)
class RankRow(Record):
    """``measurements.ddp.per_rank[]``: a rank's measured step median, its own speed (``own_s``: its no_sync
    median, without waiting for the others), its synchronised median, data wait, error and GPU
    (``distributed.gpu_of``)."""

    rank: int
    median_s: float | None = None
    own_s: float | None = None
    sync_s: float | None = None
    data_wait_share: float | None = None
    error: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class CommFigures(Record):
    """``measurements.ddp.ab``: the no_sync A/B's windows, both medians and the spread of each leg; a command's
    exchange A/B also says whether its repeats agreed within ``tolerance`` (of the step) and, where they did not,
    ``noise``: why its figure is not judged (``checks/verify/user/exchange.py``)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"agreed", "tolerance", "noise"})
    windows: int | None
    window_steps: int | None
    sync_median_s: float | None
    no_sync_median_s: float | None
    sync_spread_s: float | None
    no_sync_spread_s: float | None
    agreed: bool | None = None
    tolerance: float | None = None
    noise: str | None = None


@dataclass(frozen=True)
class DdpFigures(Record):
    """``measurements.ddp`` (``checks.verify.distributed.figures``; the contract is in that module's docstring).

    ``hosts`` and ``link_mbit_s`` only with --hosts (``link_mbit_s`` then null when no busbw was measured).
    """

    world_size: int
    backend: str
    per_rank: tuple[RankRow, ...]
    grad_bytes: int | None = None
    comm_exposed_ms: float | None = None
    comm_share: float | None = None
    busbw_gbs: float | None = None
    scaling_efficiency: float | None = None
    samples_per_s: float | None = None
    samples_per_s_one: float | None = None
    ab: CommFigures | None = None
    hosts: tuple[HostRanks, ...] | None = None
    link_mbit_s: float | None = None
    judged_rank: int | None = None  # a command: the rank whose breakdown the verdicts read (the straggler's)
    scaling_note: str | None = None  # why there is no scaling efficiency (no one-process run, or it did not measure)

    def to_json(self) -> JsonObject:
        out = super().to_json()
        if self.scaling_note is None:
            del out["scaling_note"]
        if self.hosts is None:
            del out["hosts"], out["link_mbit_s"]
        if self.judged_rank is None:
            del out["judged_rank"]
        return out


@dataclass(frozen=True)
class CommandFacts(Record):
    """``measurements.command`` (verify -- COMMAND): what ran, how it ended, who ended it, what was left."""

    argv: tuple[str, ...]
    exit_status: int | None
    ended: str  # stopped, exited, crashed, interrupted, no-step, stalled, no-torch
    stopped_by_verify: bool
    ended_by_itself: bool
    signals: tuple[str, ...]
    seconds: float
    steps_seen: dict[str, int]  # every process's optimizer steps, warm-up included, by rank (or pidN)
    processes_seen: int
    processes_left: tuple[int, ...]
    traceback: tuple[str, ...]  # a crash: the last lines of its traceback


@dataclass(frozen=True)
class ProcessFigures(Record):
    """``measurements.per_rank[]`` (verify -- COMMAND): one training process: its rank (``pidN`` without one),
    its steps and device, and with a measured step its median, own time, breakdown and rate."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"median_s", "own_s", "step_breakdown", "samples_per_s", "micro_batches_per_step"}
    )
    rank: int | str
    pid: int
    steps: int
    device: dict[str, Any]
    median_s: float | None = None
    own_s: float | None = None
    step_breakdown: dict[str, float] | None = None
    samples_per_s: float | None = None
    micro_batches_per_step: int | None = None


@dataclass(frozen=True)
class CommandStep(Record):
    """What only a command's steps tell: micro-batches and samples per optimizer step (``samples_per_step`` None
    when no batch's size could be read), what its ``forward`` share holds, and tokens per optimizer step where the
    batches are token ids (``input_ids`` [B, T], or a [B, T] integer tensor: B x T summed over the micro-batches;
    left out otherwise)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"tokens_per_step"})
    micro_batches_per_step: int
    samples_per_step: int | None
    forward_includes: str
    tokens_per_step: int | None = None


@dataclass(frozen=True)
class Measurements:
    """``measurements`` of verify's JSON report; ``to_json`` is the one place its keys are written.

    Present always: ``run``, ``dataloader``, ``diagnosis``, ``sampler``, ``files``. With a measured step: the
    ``StepBlock`` keys, ``upgrade`` and ``mfu``. When measured: the rest (a None or empty figure is left out).
    """

    run: RunFacts
    dataloader: JsonObject
    diagnosis: JsonObject  # {"verdict": id, "verdicts": [Verdict.as_dict()]}
    sampler: JsonObject  # checks.verify.sampler.summarise + csv, window, rows
    files: Files
    steps: StepBlock | None = None
    upgrade: JsonObject | None = None  # checks.verify.diagnosis.upgrade_bound
    mfu: Mfu | None = None
    cost: JsonObject | None = None  # checks.verify.cost.cost
    ddp: DdpFigures | None = None
    flops_per_step: int | None = None
    memory: JsonObject | None = None
    kernels: JsonObject | None = None
    checkpoint: Checkpoint | None = None
    oom: Oom | None = None
    sweep: JsonObject | None = None
    timeline: dict[str, tuple[float, float]] | None = None
    time_to_verdict: JsonObject | None = None  # checks.verify.stop.time_to_verdict: the budget, the stop, the cuts
    command: CommandFacts | None = None  # verify -- COMMAND: the command and how it ended
    command_step: CommandStep | None = None  # verify -- COMMAND: its keys sit at the top, beside the step figures
    per_rank: tuple[ProcessFigures, ...] | None = None  # verify -- COMMAND under torchrun: every process
    command_advice: JsonObject | None = None  # verify -- COMMAND: the loader re-runs (checks.verify.user.advice)
    model_advice: JsonObject | None = None  # verify -- COMMAND: the model-side re-runs (checks.verify.user.modelfix)
    item_cost: JsonObject | None = None  # verify -- COMMAND: checks.verify.user.itemcost

    def to_json(self) -> JsonObject:
        out: JsonObject = {"run": self.run.to_json(), "dataloader": dict(self.dataloader)}
        if self.steps is not None:
            s = self.steps
            out |= {"step_breakdown": dict(s.step_breakdown), "step_time": s.step_time.to_json()}
            out |= {"samples_per_s": s.samples_per_s, "tokens_per_s": s.tokens_per_s}
            out |= {"samples_per_s_with_checkpoints": s.samples_per_s_with_checkpoints}
            out |= {"tokens_per_s_with_checkpoints": s.tokens_per_s_with_checkpoints}
            out["enqueue_ratio"] = s.enqueue_ratio
        out["diagnosis"] = self.diagnosis
        if self.upgrade is not None:
            out["upgrade"] = self.upgrade
        if self.mfu is not None:
            out["mfu"] = self.mfu.to_json()
        out["sampler"] = self.sampler
        measured = {
            "cost": self.cost,
            "ddp": self.ddp,
            "flops_per_step": self.flops_per_step,
            "memory": self.memory,
            "kernels": self.kernels,
            "checkpoint": self.checkpoint,
            "oom": self.oom,
            "sweep": self.sweep,
            "timeline": self.timeline,
        }
        out |= {k: dump(v) for k, v in measured.items() if v}
        if self.time_to_verdict is not None:
            out["time_to_verdict"] = self.time_to_verdict
        if self.command is not None:
            out["command"] = self.command.to_json()
        if self.command_step is not None:
            out |= self.command_step.to_json()
        if self.per_rank is not None:
            out["per_rank"] = dump(list(self.per_rank))
        if self.command_advice is not None:
            out["command_advice"] = self.command_advice
        if self.model_advice is not None:
            out["model_advice"] = self.model_advice
        if self.item_cost is not None:
            out["item_cost"] = self.item_cost
        out["files"] = self.files.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "measurements") -> Measurements:
        """The measurements ``to_json`` wrote (see the module docstring)."""
        if not isinstance(data, Mapping):
            raise ContractError(f"{where}: expected a JSON object, got {type(data).__name__}")
        rest = dict(data)
        lifted = sorted({"steps", "command_step"} & set(rest))  # fields whose keys sit at the top level instead
        if lifted:
            raise ContractError(f"{where}: unknown key {lifted[0]!r}")
        try:
            steps = _lift(StepBlock, rest, where) if "step_time" in rest else None
            command_step = _lift(CommandStep, rest, where) if "forward_includes" in rest else None
            record = load_record(cls, rest, where)
        except TypedJsonError as exc:
            known = f" (known: {', '.join(exc.known)})" if exc.known else ""
            raise ContractError(f"{exc}{known}") from None
        return dataclasses.replace(record, steps=steps, command_step=command_step)


def _lift(cls: type, rest: dict[str, Any], where: str) -> Any:
    """The record ``cls`` whose keys ``Measurements.to_json`` wrote at the top level, taken out of ``rest``."""
    names = [f.name for f in dataclasses.fields(cls)]
    return load_record(cls, {k: rest.pop(k) for k in names if k in rest}, where)
