"""The records verify's runs are judged from: what the parent asks, what a run measured, how it ended.

Standard library only (no torch, no numpy; ``checks.typedjson``, the one typed JSON reader, and
``checks.reports.verify``, the report's records, are too).

Every run is a command under the agent (``checks/verify/user/``): the agent's event lines (``step``, ``loader``,
``device``, ``flops``, ``memory``, ``kernels``, ...; documented in docs/verify.md, "the agent's hooks") are typed
records of their own (``checks.verify.events``: one class per kind, parsed once by the launcher) read by
``checks.verify.user.judge``, which builds the records here and judges them with ``checks.verify.report``'s API:

- ``DataSpec``: the tool's script's data as verify checked it before the run (synthetic, or staged at ``path``).
- ``StopSpec``: the stop rule's settings (``checks/verify/stop.py``); ``StopFacts`` and ``Cut``: how the measured
  steps ended and what the budget left out.
- ``ChildResult``: what one process measured, in the shape the verdict rules read: ``Step`` per optimizer step
  (seconds per phase), ``Device``, ``DataInfo``, ``Checkpoint``, ``Oom``, ``memory`` and ``kernels`` (the agent's
  CUDA figures, JSON objects whose keys docs/formats.md lists). The recorded GPU traces
  (``tests/fixtures/traces``) are ``ChildResult`` records too, with ``ranks`` (``RankResult``, ``RankDevice``,
  ``RankDdp``, ``CommAb``, ``Solo``) for a DDP run.
- ``ChildRun``: a run as the judge gets it: the result, and how the run ended.
- ``Measurements`` (``checks.reports.verify``, one floor down so that ``plan --from`` reads it too): the
  ``measurements`` object of verify's JSON report, built by the judge. ``Device``, ``ModelInfo``, ``DataInfo``,
  ``Checkpoint``, ``Oom`` and ``HostRanks`` are defined there and shared by ``ChildResult``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from checks.reports.verify import Checkpoint, DataInfo, Device, HostRanks, ModelInfo, Oom
from checks.typedjson import JsonObject, Record

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
    """A part the whole-command budget shortened or left out (``part``: "warmup", "measure", "sweep",
    "ab", "advice"), what was done instead, and how to get all of it (``fix``: a flag)."""

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
    ab: JsonObject | None = None  # recorded only: the built-in loop's compile A/B (tests' traces); nothing reads it
    sweep: JsonObject | None = None  # extras.sweep, or {"error": ...}
    loader_alone: JsonObject | None = None  # recorded only (runs/cpu-data-bound.json): the built-in loop's; unread
    data_cost: JsonObject | None = None  # recorded only, as loader_alone: nothing reads it
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


@dataclass
class ChildRun:
    """A run as the judge gets it: the (possibly partial) result, whether Ctrl-C cut it, how long it ran."""

    result: ChildResult | None
    interrupted: bool = False
    seconds: float = 0.0
