"""The agent's event lines as typed records: one class per ``event`` kind, and the one parser of a line.

The agent (``checks/verify/user/inject/_gpu_preflight_agent.py``, standard library only) writes one JSON object a
line, ``{"event": KIND, "t": monotonic seconds, "pid": N, ...}``; the launcher's tail reader (``_Tails`` in
``checks/verify/user/launch.py``) parses each line once with ``parse_line`` and every reader in the parent works
on these records (``isinstance`` and attributes). Standard library only, as ``checks.verify.contract``.

- ``parse_line``/``parse``: a line (or its JSON object) to its record. A line of an unknown kind, a broken one (not
  JSON, a missing or mistyped field) is ``None`` (the caller counts it and goes on): a line never crashes verify.
  A field no record names is dropped, unless ``STRICT`` (the tests' setting: a field the agent adds without its
  record then fails the test that ran the command) raises ``ContractError``.
- ``Waiting`` is the launcher's own tick (no step for a while), never an agent line.
- A run's events cross hosts as JSON (``checks/verify/user/node.py``): ``Event.to_json`` writes the line back,
  ``host`` the node's name the controller tags each with (``checks/verify/hosts.py``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from checks.typedjson import ContractError, JsonObject, Record

STRICT = False  # True: a field no record names raises ContractError (tests); False: dropped (verify)


@dataclass(frozen=True, kw_only=True)
class Event(Record):
    """What every agent line has: when (``time.monotonic()`` in its process) and which process wrote it."""

    KIND: ClassVar[str] = ""
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"host"})
    t: float
    pid: int
    host: str | None = None  # --hosts: the node whose verify read the line (the controller's tag)

    def to_json(self) -> JsonObject:
        return {"event": self.KIND, **super().to_json()}


@dataclass(frozen=True, kw_only=True)
class Ranked(Event):
    """A line with torchrun's rank fields (None for a process started without them)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None  # the ranks on this node: what verify here can see step

    @property
    def key(self) -> int | str:
        """The process: its rank, or ``pidN`` for a process without one."""
        return self.rank if self.rank is not None else f"pid{self.pid}"

    @property
    def lead(self) -> bool:
        """Rank 0's, or the only process's."""
        return self.rank in (0, None)


@dataclass(frozen=True, kw_only=True)
class Hello(Ranked):
    """The agent armed in a process that imported torch."""

    KIND = "hello"
    argv: tuple[str, ...] = ()
    ppid: int | None = None
    pgid: int | None = None
    main: bool = True  # not a multiprocessing child (a DataLoader worker)


@dataclass(frozen=True, kw_only=True)
class TorchVersion(Event):
    KIND = "torch"
    version: str


@dataclass(frozen=True, kw_only=True)
class AgentError(Event):
    """A hook that raised: the user's code went on without it."""

    KIND = "agent-error"
    where: str
    error: str


@dataclass(frozen=True, kw_only=True)
class DeviceLine(Ranked):
    """The device the process steps on, decided at its first step; ``index``: torch's on this host (CUDA)."""

    KIND = "device"
    type: str
    name: str
    uuid: str | None = None
    index: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepLine(Ranked):
    """One optimizer step: seconds per phase (exclusive time) and what the step consumed."""

    KIND = "step"
    i: int
    data_wait: float
    h2d: float
    forward: float
    backward: float
    optimizer: float
    checkpoint: float = 0.0
    forward_explicit: float = 0.0
    other_loaders: float = 0.0
    host_start: float
    host_end: float
    enqueue_s: float
    fetch: tuple[tuple[float, float], ...] = ()
    loss: float | None = None
    micro: int = 0
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    feed: str | None = None
    saves: int = 0
    ckpt_bytes: int = 0
    clock: str = "monotonic"
    precision: str | None = None
    comm_exposed: float | None = None
    comm_bytes: int | None = None
    peak_bytes: int | None = None
    fetched_samples: int | None = None  # map-style fetches in this process (num_workers=0)
    fetched_batches: int | None = None
    getitem_s: float | None = None
    collate_s: float | None = None

    @property
    def seconds(self) -> float:
        """The step's phases together (checkpoint time apart)."""
        return self.data_wait + self.h2d + self.forward + self.backward + self.optimizer


@dataclass(frozen=True, kw_only=True)
class LoaderLine(Ranked):
    """A DataLoader built: its dataset (``feed``, the steps' key), the settings it ran with, what was asked."""

    KIND = "loader"
    feed: str
    dataset: str = ""
    samples: int | None = None  # the dataset's len (None: iterable)
    batch_size: int | None = None  # None: batched by a batch_sampler
    settings: dict[str, Any]
    asked: dict[str, Any]
    site: str = "?"


@dataclass(frozen=True, kw_only=True)
class FetchLine(Event):
    """One batch a DataLoader worker built: its samples' ``__getitem__`` time and its collate's."""

    KIND = "fetch"
    feed: str
    ppid: int
    worker: int
    workers: int
    samples: int
    getitem_s: float
    collate_s: float


@dataclass(frozen=True, kw_only=True)
class TransformsLine(Event):
    """One sampled batch (the measured run's, ``GPU_PREFLIGHT_SPLIT``) whose samples had each step of their
    dataset's transform pipeline timed: the steps' seconds in order, and the samples' whole ``__getitem__`` time
    (what the steps leave: the read and the decode). ``worker``: None where the training process built it."""

    KIND = "transforms"
    feed: str
    ppid: int
    worker: int | None = None
    samples: int
    getitem_s: float
    method: str  # "compose": a Compose-like ``.transforms`` list; "transform": one callable
    where: str  # the pipeline's attribute: "BlurredPhotos.transform"
    names: tuple[str, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class FlopsLine(Ranked):
    """One warm-up step's FLOPs (None with ``note``: not counted)."""

    KIND = "flops"
    OMIT_NONE = frozenset({"host", "step", "missed", "ops", "note"})
    flops: int | None
    step: int | None = None
    missed: int | None = None
    ops: int | None = None
    note: str | None = None


MEMORY_KEYS: tuple[str, ...] = ("total_bytes", "free_bytes", "allocated_bytes", "reserved_bytes")
MEMORY_KEYS += ("peak_allocated_bytes", "peak_reserved_bytes", "inactive_split_bytes", "num_alloc_retries")
MEMORY_KEYS += ("num_ooms", "num_device_alloc")


@dataclass(frozen=True, kw_only=True)
class MemoryLine(Ranked):
    """The CUDA caching allocator's figures at a step's end (``at`` "step") or at exit ("exit")."""

    KIND = "memory"
    total_bytes: int
    free_bytes: int | None = None
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    inactive_split_bytes: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_device_alloc: int | None = None
    step: int = 0
    at: str = "step"

    def figures(self) -> JsonObject:
        """The figures the near-oom rule reads (``ChildResult.memory``: ``MEMORY_KEYS``)."""
        return {k: getattr(self, k) for k in MEMORY_KEYS}


@dataclass(frozen=True, kw_only=True)
class KernelsLine(Ranked):
    """One profiled warm-up step's CUDA kernels (``note`` and no figures: none recorded, or not profiled)."""

    KIND = "kernels"
    OMIT_NONE = frozenset({"host", "steps", "kernels_per_step", "note"})
    step: int
    steps: int | None = None
    kernels_per_step: float | None = None
    median_kernel_us: float | None = None
    short_kernel_time_share: float | None = None
    busy_fraction: float | None = None
    note: str | None = None

    def figures(self) -> JsonObject:
        """The launch-bound rule's inputs (``ChildResult.kernels``)."""
        out = self.to_json()
        for key in ("event", "t", "pid", "rank", "local_rank", "world_size", "local_world_size"):
            out.pop(key, None)
        return out


@dataclass(frozen=True, kw_only=True)
class ModelChange(Ranked):
    """A re-run's model-side change applied at the first optimizer step (``conv``: the models hold 4-D weights)."""

    KIND = "model-change"
    asked: dict[str, Any]
    models: tuple[str, ...] = ()
    conv: bool = False


@dataclass(frozen=True, kw_only=True)
class AutocastOff(Ranked):
    """The script's first bf16 autocast region on ``device`` entered disabled (the fp32 re-run)."""

    KIND = "autocast-off"
    device: str


@dataclass(frozen=True, kw_only=True)
class Saved(Ranked):
    """``torch.save`` to a file (absolute ``path``), outside another checkpoint writer's call."""

    KIND = "saved"
    path: str


@dataclass(frozen=True, kw_only=True)
class Moved(Ranked):
    """A saved file renamed (``os.replace``/``os.rename``) from ``path`` to ``to``."""

    KIND = "moved"
    path: str
    to: str


@dataclass(frozen=True, kw_only=True)
class DdpLine(Ranked):
    """DDP's first forward: its backend, and whether the agent's timing comm hook went in (not the script's own)."""

    KIND = "ddp"
    backend: str
    hooked: bool


@dataclass(frozen=True, kw_only=True)
class DdpSkipped(Ranked):
    """The exchange A/B's skip leg: the agent's hook hands every gradient bucket back unreduced."""

    KIND = "ddp-skipped"


@dataclass(frozen=True, kw_only=True)
class PhaseLine(Ranked):
    """A part of the run the script marked as no training step (``phase("eval")``), at its end: its seconds (out
    of every step's time) and the optimizer steps done before it."""

    KIND = "phase"
    name: str
    seconds: float
    step: int


@dataclass(frozen=True)
class Waiting:
    """The launcher's own tick: no step for ``seconds`` (``steps`` done so far). Never an agent line."""

    seconds: float
    steps: int


_ALL: tuple[type[Event], ...] = (Hello, TorchVersion, AgentError, DeviceLine, StepLine, LoaderLine, FetchLine)
_ALL += (FlopsLine, MemoryLine, KernelsLine, ModelChange, AutocastOff, Saved, Moved, DdpLine, DdpSkipped)
_ALL += (PhaseLine, TransformsLine)
KINDS: dict[str, type[Event]] = {cls.KIND: cls for cls in _ALL}  # the agent's ``event`` -> its record


def fields_of(cls: type[Event]) -> frozenset[str]:
    """The keys a line of ``cls`` may hold (``event`` and the parent's ``host`` tag left out)."""
    return frozenset(f.name for f in dataclasses.fields(cls)) - {"host"}


_KNOWN = {kind: fields_of(cls) | {"host"} for kind, cls in KINDS.items()}  # worked out once, not per line


def parse(data: Any, strict: bool | None = None) -> Event | None:
    """The record of one line's JSON object; None for an unknown kind or a broken line (a missing or mistyped
    field). A field its record does not name is dropped. ``strict`` (default: ``STRICT``): each of those is a
    ``ContractError`` instead."""
    strict = STRICT if strict is None else strict
    if not isinstance(data, dict):
        if strict:
            raise ContractError(f"agent line that is not a JSON object: {str(data)[:80]!r}")
        return None
    kind = data.get("event")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        if strict:
            raise ContractError(f"agent line of an unknown kind: {str(data.get('event'))[:80]!r}")
        return None
    known = _KNOWN[cls.KIND]
    body = {k: v for k, v in data.items() if k != "event"}
    unknown = sorted(set(body) - known)
    if unknown:
        if strict:
            raise ContractError(f"{cls.__name__}: unknown key {unknown[0]!r} in the agent's {cls.KIND!r} line")
        body = {k: v for k, v in body.items() if k in known}
    try:
        return cls.from_json(body)
    except ContractError:
        if strict:
            raise
        return None


def parse_all(items: Any) -> list[Event]:
    """The records of a list of lines' JSON objects (a node's run, ``checks/verify/user/node.py``), broken ones
    left out."""
    parsed = [parse(item) for item in items or ()]
    return [e for e in parsed if e is not None]


def parse_line(line: str) -> Event | None:
    """The record of one JSON line (see ``parse``); None for a line that is not JSON."""
    try:
        data = json.loads(line)
    except ValueError:
        if STRICT and line.strip():
            raise ContractError(f"agent line that is not JSON: {line[:80]!r}") from None
        return None
    return parse(data)
