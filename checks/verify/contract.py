"""The records that cross verify's process boundary.

Standard library only (no torch, no numpy; ``checks.typedjson``, the one typed JSON reader, and
``checks.reports.verify``, the report's records, are too): the parent
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
- ``Measurements`` (``checks.reports.verify``, one floor down so that ``plan --from`` reads it too): the
  ``measurements`` object of verify's JSON report, built from these records; ``checks.verify.report.judge``
  returns it in a ``Judgement`` with the results and verdicts. ``Device``, ``ModelInfo``, ``DataInfo``,
  ``Checkpoint``, ``Oom`` and ``HostRanks`` are defined there and shared by ``ChildResult``.

Every record (``checks.typedjson.Record``) has ``to_json()`` and ``from_json()`` (which rejects an unknown key or a value of the wrong type,
naming the record and the key); keys in a record's ``OMIT_NONE`` are left out of its JSON when None, as the
producer leaves them out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from checks.reports.verify import Checkpoint, DataInfo, Device, HostRanks, ModelInfo, Oom
from checks.typedjson import ContractError, JsonObject, Record, dump

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
        """Tokens per sample: the built-in token data's or a --dataset's sequence length, or a command's (the
        judge's tokens per step / samples per step, ``checks/verify/user/judge.py``); 0 for other data."""
        d = self.data
        return (d.seq_len or 0) if d is not None and d.kind in ("tokens", "user", "command") else 0


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
