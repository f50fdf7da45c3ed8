"""The records that cross verify's process boundary, and the measurements its JSON report is built from.

Standard library only (no torch, no numpy; ``checks.typedjson``, the one typed JSON reader, is too): the parent
(``checks.verify.plan``, ``report``, the launcher) and the training child (``checks.verify.smoke.child``) import
the same records, and so can any other producer of a run
(a user's own training command instrumented at interpreter start-up, ranks started by torchrun or Slurm): a
producer that writes these records is judged by the same report.

The flow, and the record at each hop::

    parent --RunSpec (spec.json)--> child --Event lines (events.jsonl)--> parent (progress, stall detection)
           <--ChildResult (result.json)-- child            launcher --ChildRun--> report.judge --Judgement

- ``RunSpec``: what the parent asks of the child (device, precision, data, model, steps, DataLoader keywords, the
  optional phases' settings). ``DdpSpec`` under ``ddp`` for several processes: the launcher adds each rank's
  ``rank``, ``local_rank``, ``addr``, ``port`` and ``nodes``. ``events`` and ``result`` are the two files the
  child writes (the launcher fills them in).
- Events, one JSON object per line, ``{"event": KIND, "t": monotonic seconds, ...}``: ``PhaseEvent``
  (``phase``: a phase began), ``StepEvent`` (``phase``, ``i`` of ``of``: a step ended), ``DeviceEvent`` (the
  device's fields, as soon as it is known: the parent's sampler follows its ``uuid``), ``OomProbeEvent`` and
  ``SweepEvent`` (``batch``: a batch size is being tried), ``EstimateEvent`` (after the warm-up: the time the
  rest will take, which the parent prints). ``parse_event`` turns a line into its record and
  rejects an unknown kind or key with ``ContractError``; ``event_line`` writes one.
- ``ChildResult``: what one process measured, written once at the end (also after Ctrl-C or an error: every
  field has a default, so a partial result is still one). ``Step`` per optimizer step (seconds on the device
  clock), ``Device``, ``ModelInfo``, ``DataInfo``, ``Checkpoint`` (with ``DataResume``), ``Oom``, and under
  ``ddp`` the rank's own ``RankDdp`` (``CommAb``: the no_sync A/B, ``Solo``: rank 0's one-process leg). An
  optional phase that failed holds ``{"error": ...}`` instead of its figures (``Checkpoint.error``; the figures
  kept as JSON objects: ``kernels``, ``memory``, ``ab``, ``sweep``, ``loader_alone``, ``data_cost``, whose keys
  are documented where they are measured, ``checks/verify/smoke/extras.py`` and ``candidates.py``).
- ``RankResult``: one rank's steps, A/B figures, error and device (``RankDevice``), listed under the combined
  result's ``ranks`` by the launcher (rank 0's result stands for the run).
- ``ChildRun``: what the launcher hands the judge: the parsed result (None when none was written), the events,
  and how the run ended (``failure``: timeout, stalled, crashed, killed; ``rank`` when one can be named).
- ``Measurements``: the ``measurements`` object of verify's JSON report. ``Measurements.to_json`` is the one
  place its keys are written (docs/formats.md lists them; ``tests/checks/verify/verify_report.schema.json``
  holds them); ``checks.verify.report.judge`` returns it in a ``Judgement`` with the results and verdicts. Its
  parts: ``RunFacts`` (``run``), ``StepBlock`` (``step_breakdown``, ``step_time``: ``StepTime``, the rates,
  ``enqueue_ratio``), ``Mfu``, ``Files``, and under several processes ``DdpFigures`` (``ddp``: ``RankRow`` per
  rank, ``CommFigures`` for the no_sync A/B); the sampler, cost, upgrade and diagnosis blocks are JSON objects
  built by ``checks.verify.sampler.summarise``, ``cost.cost``, ``diagnosis.upgrade_bound`` and
  ``report.diagnosis_rows``.

Every record has ``to_json()`` and ``from_json()`` (which rejects an unknown key or a value of the wrong type,
naming the record and the key); keys in a record's ``OMIT_NONE`` are left out of its JSON when None, as the
producer leaves them out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from checks.typedjson import TypedJsonError, dump, dump_fields, load_record

JsonObject = dict[str, Any]  # figures kept as the producer wrote them (their keys: where they are measured)
R = TypeVar("R", bound="Record")


class ContractError(ValueError):
    """A JSON document that is not the record it should be; the message names the record and the key."""


class Record:
    """A frozen dataclass that converts to and from its JSON object (see the module docstring), with
    ``checks.typedjson``: the one typed reader and writer, shared with machine snapshots."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> JsonObject:
        return dump_fields(self)

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        try:
            return typing.cast(R, load_record(cls, data, where or cls.__name__))
        except TypedJsonError as exc:
            known = f" (known: {', '.join(exc.known)})" if exc.known else ""
            raise ContractError(f"{exc}{known}") from None


# --- the run spec: parent -> child ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSpec(Record):
    """The built-in data the child trains on (synthetic, or staged by stage-data at ``path``)."""

    kind: str  # "images" | "tokens"
    source: str  # "synthetic" | "staged"
    samples: int
    path: str = ""
    image_size: int = 0
    classes: int = 0
    seq_len: int = 0
    vocab: int = 0

    def describe(self) -> str:
        where = f"staged at {self.path}" if self.source == "staged" else "synthetic"
        if self.kind == "images":
            return (
                f"{where} images {self.image_size}x{self.image_size}, {self.classes} classes, {self.samples:,} samples"
            )
        return f"{where} tokens, vocabulary {self.vocab}, windows of {self.seq_len}, {self.samples:,} samples"

    def as_dict(self) -> JsonObject:
        return self.to_json()


@dataclass(frozen=True)
class LoaderProbeSpec(Record):
    """Time the DataLoader alone after the loop when the data wait reached ``min_share``."""

    seconds: float
    min_share: float
    cores: float


@dataclass(frozen=True)
class CheckpointSpec(Record):
    """The checkpoint round trip: save to ``dir``, run ``resume_steps`` on, reload, compare within ``rtol``."""

    dir: str
    resume_steps: int
    rtol: float


@dataclass(frozen=True)
class SweepSpec(Record):
    """--sweep: double the batch up to ``limit`` until OOM or a doubling gains less than 1/knee - 1."""

    limit: int
    warmup: int
    steps: int
    knee: float


@dataclass(frozen=True)
class AbSpec(Record):
    """--ab: ``steps`` steps of the torch.compile'd model."""

    steps: int


@dataclass(frozen=True)
class DdpSpec(Record):
    """Several processes: the plan's part (``distributed.spec_block``) and each rank's (set by the launcher)."""

    world_size: int
    backend: str  # "nccl" | "gloo"
    threads: int = 0  # gloo: intra-op threads per rank (the cores shared out); 0: torch's default
    windows: int = 0
    window_steps: int = 0
    solo_steps: int = 0
    timeout_s: float = 0.0
    rank: int = 0
    local_rank: int = 0
    addr: str = ""  # the TCP store: rank 0's host
    port: int = 0
    nodes: int = 1


@dataclass(frozen=True)
class RunSpec(Record):
    """What the parent asks of the training child (``spec.json``)."""

    device: str  # "auto" | "cuda" | "cpu"
    precision: str  # "auto" | "bf16" | "fp16" | "fp32"
    model_size: str  # "auto" | "small" | "base"
    data: DataSpec | None  # None: the user's --dataset
    dataset: str  # --dataset MODULE:CALLABLE, or ""
    model: str  # --model MODULE:CALLABLE, or ""
    user_path: str  # where --dataset/--model import from
    batch_size: int  # 0: batch_size_cpu or batch_size_gpu by device
    batch_size_cpu: int
    batch_size_gpu: int
    accum: int
    warmup: int
    steps: int
    lr: float
    seed: int
    loader: JsonObject  # DataLoader settings (num_workers, pin_memory, persistent_workers, prefetch_factor)
    profile_steps: int
    loader_probe: LoaderProbeSpec | None = None
    checkpoint: CheckpointSpec | None = None
    sweep: SweepSpec | None = None
    ab: AbSpec | None = None
    ddp: DdpSpec | None = None
    events: str = ""  # the events file the child appends to (the launcher's)
    result: str = ""  # where the child writes its result
    stop: StopSpec | None = None  # the whole-command budget and the stability stop (None: exactly ``steps``)


@dataclass(frozen=True)
class StopSpec(Record):
    """When the measured steps end (``checks/verify/stop.py``): at ``steps`` at most, earlier once every share is
    stable (``min_steps`` measured, each share's 95% interval over ``batches`` batch means within ``width``), or
    when the whole command's budget would not hold another step with what comes after it (``deadline``:
    ``time.monotonic()`` on the child's host; 0: none). ``forced``: ``--steps N``, exactly N whatever they cost
    (the optional phases after them still fit the budget)."""

    min_steps: int
    width: float
    batches: int
    budget_s: float  # the whole command's (verify.budget, --budget): quoted in the cuts' fixes
    deadline: float = 0.0
    measure_s: float = 0.0  # > 0: the measured steps' own cap (verify.measure_budget_s)
    forced: bool = False


# --- events: child -> parent, one JSON line each ---------------------------------------------------------------


@dataclass(frozen=True)
class PhaseEvent(Record):
    """A phase began (setup, flops, warmup, measure, kernels, checkpoint, comm, solo, ab, sweep, ...)."""

    KIND: ClassVar[str] = "phase"
    phase: str
    t: float = 0.0


@dataclass(frozen=True)
class StepEvent(Record):
    """Step ``i`` of ``of`` of ``phase`` ended."""

    KIND: ClassVar[str] = "step"
    phase: str
    i: int
    of: int
    t: float = 0.0


@dataclass(frozen=True)
class DeviceEvent(Record):
    """The device the child trains on (``Device``'s fields), as soon as it is known."""

    KIND: ClassVar[str] = "device"
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"total_memory"})
    type: str
    name: str
    uuid: str | None = None
    capability: tuple[int, ...] | None = None
    total_memory: int | None = None
    t: float = 0.0


@dataclass(frozen=True)
class OomProbeEvent(Record):
    """After an out-of-memory error: batch ``batch`` is being tried."""

    KIND: ClassVar[str] = "oom-probe"
    batch: int
    t: float = 0.0


@dataclass(frozen=True)
class SweepEvent(Record):
    """--sweep: batch ``batch`` is being timed."""

    KIND: ClassVar[str] = "sweep"
    batch: int
    t: float = 0.0


@dataclass(frozen=True)
class EstimateEvent(Record):
    """After the warm-up: ``step_s`` a step, ``least`` to ``most`` measured steps, then ``rest_s`` for the phases
    after them; ``left_s`` of the budget remain (0: no budget)."""

    KIND: ClassVar[str] = "estimate"
    step_s: float
    least: int
    most: int
    rest_s: float
    left_s: float = 0.0
    t: float = 0.0


Event = PhaseEvent | StepEvent | DeviceEvent | OomProbeEvent | SweepEvent | EstimateEvent
EVENTS: dict[str, type[Record]] = {
    c.KIND: c for c in (PhaseEvent, StepEvent, DeviceEvent, OomProbeEvent, SweepEvent, EstimateEvent)
}


def parse_event(line: str | Mapping[str, Any]) -> Event:
    """The record of one events line; ``ContractError`` for bad JSON, an unknown kind or an unknown key."""
    try:
        data = json.loads(line) if isinstance(line, str) else dict(line)
    except json.JSONDecodeError as exc:
        raise ContractError(f"event: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ContractError(f"event: expected a JSON object, got {type(data).__name__}")
    kind = data.pop("event", None)
    if kind not in EVENTS:
        raise ContractError(f"event: unknown kind {kind!r} (known: {', '.join(EVENTS)})")
    return typing.cast(Event, EVENTS[kind].from_json(data, f"event {kind}"))


def event_line(e: Event) -> str:
    """One events line (no newline): ``{"event": KIND, ...fields}``."""
    return json.dumps({"event": e.KIND, **e.to_json()})


# --- the child's result: child -> parent -----------------------------------------------------------------------

PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Step(Record):
    """One optimizer step: seconds per phase on the device clock; host times are monotonic seconds.

    data_wait runs from the previous step's end to the batch being ready; ``fetch`` holds the host windows spent
    blocked on a batch; ``enqueue_s`` the host time spent issuing the step (everything but those windows).
    """

    data_wait: float
    h2d: float
    forward: float
    backward: float
    optimizer: float
    host_start: float = 0.0
    host_end: float = 0.0
    enqueue_s: float = 0.0
    fetch: tuple[tuple[float, float], ...] = ()
    loss: float = math.nan

    @property
    def total(self) -> float:
        return self.data_wait + self.h2d + self.forward + self.backward + self.optimizer

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.optimizer


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
    """The loader rebuilt from the saved position against the kept batches (``ckpt.same_batches``)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"differs"})
    batches: int
    exact: bool
    order_same: bool  # the samplers yielded the same sample indices (older results: the targets agreed)
    first_difference: int | None = None
    workers: int = 0
    differs: tuple[str, ...] | None = None  # "inputs", "targets": the parts that differ in some batch


@dataclass(frozen=True)
class Checkpoint(Record):
    """``measurements.checkpoint``: a save's cost, and for the built-in loop the round trip's verdict (only
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
class CommAb(Record):
    """The no_sync A/B (``smoke/ddp.comm_ab``): every step's seconds of both legs, their medians, gradient bytes."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"windows", "window_steps", "sync_s", "no_sync_s", "exposed_s", "grad_bytes"}
    )
    sync_median_s: float | None = None
    no_sync_median_s: float | None = None
    windows: int | None = None
    window_steps: int | None = None
    sync_s: tuple[float, ...] | None = None
    no_sync_s: tuple[float, ...] | None = None
    exposed_s: float | None = None
    grad_bytes: int | None = None


@dataclass(frozen=True)
class Solo(Record):
    """Rank 0 alone on the bare module: the one-process rate of the scaling efficiency."""

    steps: int
    median_s: float


@dataclass(frozen=True)
class HostRanks(Record):
    """--hosts: which global ranks ran on ``host`` (``address`` as SSH reached it)."""

    host: str
    address: str | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RankDdp(Record):
    """A rank's own DDP figures (``ddp`` of its result)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"comm_ab", "solo", "hosts"})
    rank: int = 0
    world_size: int = 1
    backend: str = ""
    comm_ab: CommAb | None = None
    solo: Solo | None = None
    hosts: tuple[HostRanks, ...] | None = None  # --hosts, added by the controller


@dataclass(frozen=True)
class RankDevice(Record):
    """A rank's device: its torch index on its host and UUID on a GPU; ``nvml_index`` where the parent's NVML
    knows the UUID (bootstrap's ``gpuN``)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"nvml_index"})
    type: str | None = None
    index: int | None = None
    uuid: str | None = None
    nvml_index: int | None = None


@dataclass(frozen=True)
class StopFacts(Record):
    """How the measured steps ended: ``reason`` "stable" (every share's 95% half-width within ``width`` after
    ``least`` steps), "budget" (the budget would not hold another), "steps" (``most``, the cap, reached unstable),
    "forced" (``--steps N``, ``--seconds S``) or "exited" (a command that ended by itself); ``half_width``: each
    share's at the end (None: too few steps to tell)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"half_width", "warm_step_s"})
    reason: str
    measured: int
    least: int
    most: int
    asked: int
    width: float
    half_width: dict[str, float] | None = None
    warm_step_s: float | None = None
    estimate_s: float | None = None  # the time to the verdict printed after the warm-up


@dataclass(frozen=True)
class Cut(Record):
    """A part the whole-command budget shortened or left out (``part``: "warmup", "measure", "loader_alone",
    "sweep", "ab", "advice"), what was done instead, and how to get all of it (``fix``: a flag)."""

    part: str
    summary: str
    fix: str


@dataclass(frozen=True)
class RankResult(Record):
    """One rank's part of a several-process run (the combined result's ``ranks``)."""

    rank: int
    steps: tuple[Step, ...] = ()
    ddp: RankDdp | None = None
    error: str | None = None
    device: RankDevice | None = None


@dataclass(frozen=True)
class ChildResult(Record):
    """What one training process measured (``result.json``); every field has a default (a partial result)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"error_kind", "error_hint", "phase", "ddp", "kernels", "memory", "checkpoint", "oom", "ab", "sweep"}
        | {"loader_alone", "data_cost", "flops_per_step", "flops_note", "stop"}
    )
    interrupted: bool = False
    error: str | None = None
    error_kind: str | None = None  # "usage" (exit 2 in the parent) | "crash"
    error_hint: str | None = None  # with a usage error: its fix, as the code that raised it says it
    phase: str | None = None  # the last phase begun
    timeline: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> (start, end), monotonic s
    warmup: tuple[Step, ...] = ()
    steps: tuple[Step, ...] = ()
    device: Device | None = None
    torch: str | None = None
    threads: int | None = None
    precision: str | None = None
    batch_size: int | None = None
    accum: int | None = None
    loader: JsonObject | None = None  # the DataLoader keywords the loop ran with
    model: ModelInfo | None = None
    data: DataInfo | None = None
    flops_per_step: int | None = None
    flops_note: str | None = None
    kernels: JsonObject | None = None  # extras.kernel_summary, or {"error": ...}
    memory: JsonObject | None = None  # extras.memory (a GPU only)
    checkpoint: Checkpoint | None = None
    oom: Oom | None = None
    ab: JsonObject | None = None  # extras.compile_ab, or {"error": ...}
    sweep: JsonObject | None = None  # extras.sweep, or {"error": ...}
    loader_alone: JsonObject | None = None  # candidates.loader_alone, or {"error": ...}
    data_cost: JsonObject | None = None  # candidates.data_cost, or {"error": ...}
    ddp: RankDdp | None = None
    ranks: tuple[RankResult, ...] = ()  # several processes: every rank (set by the launcher)
    stop: StopFacts | None = None  # RunSpec.stop: how the measured steps ended
    cuts: tuple[Cut, ...] = ()  # what the budget shortened or left out

    def to_json(self) -> JsonObject:
        out = super().to_json()
        for key in ("ranks", "cuts"):
            if not out[key]:
                out.pop(key)
        return out

    @property
    def samples_per_step(self) -> int:
        """Samples one optimizer step trains on, over every rank (each trains ``batch_size`` x ``accum``)."""
        ranks = self.ddp.world_size if self.ddp else 1
        return (self.batch_size or 0) * (self.accum or 1) * ranks

    @property
    def tokens_per_sample(self) -> int:
        d = self.data
        return (d.seq_len or 0) if d is not None and d.kind in ("tokens", "user") else 0


def phase_ok(figures: JsonObject | None) -> JsonObject | None:
    """An optional phase's figures; None when it did not run or failed (its error stays in the measurements)."""
    return None if not figures or "error" in figures else figures


@dataclass
class ChildRun:
    """What the launcher hands the judge: the (possibly partial) result, the events, and why the run ended."""

    result: ChildResult | None
    events: list[Event] = field(default_factory=list)
    failure: str | None = None  # "timeout", "stalled", "crashed", "killed"
    interrupted: bool = False
    log_tail: str = ""
    seconds: float = 0.0
    rank: int | None = None  # several processes: the rank that failed or hung, when one can be named
    env_kept: tuple[str, ...] = ()  # ``extra_env`` names the caller's environment had set already (theirs was kept)

    def to_json(self) -> JsonObject:
        """The run without its events (``smoke/node.py`` prints this for the controller of --hosts)."""
        out = {f.name: dump(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "events"}
        out["result"] = None if self.result is None else self.result.to_json()
        return out


# --- the measurements of the JSON report ------------------------------------------------------------------------


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
    """``measurements.ddp.ab``: the no_sync A/B's windows, both medians and the spread of each leg."""

    windows: int | None
    window_steps: int | None
    sync_median_s: float | None
    no_sync_median_s: float | None
    sync_spread_s: float | None
    no_sync_spread_s: float | None


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

    def to_json(self) -> JsonObject:
        out = super().to_json()
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
    ab: JsonObject | None = None
    sweep: JsonObject | None = None
    loader_alone: JsonObject | None = None
    timeline: dict[str, tuple[float, float]] | None = None
    loader_candidates: Sequence[JsonObject] | None = None  # with ``advice``: the loader was timed alone
    advice: JsonObject | None = None  # checks.verify.advice.loader_advice
    data_cost: JsonObject | None = None
    time_to_verdict: JsonObject | None = None  # checks.verify.stop.time_to_verdict: the budget, the stop, the cuts
    command: CommandFacts | None = None  # verify -- COMMAND: the command and how it ended
    command_step: CommandStep | None = None  # verify -- COMMAND: its keys sit at the top, beside the step figures
    per_rank: tuple[ProcessFigures, ...] | None = None  # verify -- COMMAND under torchrun: every process
    command_advice: JsonObject | None = None  # verify -- COMMAND: the loader re-runs (checks.verify.user.advice)
    model_advice: JsonObject | None = None  # verify -- COMMAND: the model-side re-runs (checks.verify.user.modelfix)

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
            "ab": self.ab,
            "sweep": self.sweep,
            "loader_alone": self.loader_alone,
            "timeline": self.timeline,
        }
        out |= {k: dump(v) for k, v in measured.items() if v}
        if self.loader_candidates is not None:
            out |= {"loader_candidates": dump(list(self.loader_candidates)), "advice": self.advice}
        if self.data_cost:
            out["data_cost"] = self.data_cost
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
        out["files"] = self.files.to_json()
        return out
