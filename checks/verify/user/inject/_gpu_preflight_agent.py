"""gpu-preflight's agent inside the user's own training processes (``invoke verify -- COMMAND``).

Imported by the start-up file of this folder in every Python process the command starts; standard library only
until the process itself imports torch, and nothing at all unless ``GPU_PREFLIGHT_EVENTS`` names a folder.
Once torch is imported it installs torch's global hooks and a few patches:

- an optimizer step is one step: ``torch.optim.optimizer.register_optimizer_step_pre_hook``/``_post_hook``
  (every optimizer, wrappers included); a closure passed to ``step`` (Lightning) is timed as forward;
- data wait: time inside ``_BaseDataLoaderIter.__next__`` (both iterators and any subclass); several loaders
  are told apart by their dataset, and the step's data wait is the one its steps consume from most;
- backward: ``torch.Tensor.backward`` and ``torch.autograd.backward`` (outermost call), which also counts the
  micro-batches of gradient accumulation;
- checkpoint: ``torch.save``, safetensors' ``save_file``/``save_model``, ``torch.distributed.checkpoint.save``/
  ``async_save``, accelerate's ``save_state``, Lightning's ``Trainer.save_checkpoint``/``TorchCheckpointIO``, the
  transformers ``Trainer``'s ``_save_checkpoint``/``save_model``: the outermost call is one save, its bytes the
  files it wrote (modified under its target during the call) or a buffer's growth;
- the batch: its samples (the collated batch dimension) and, for token ids, its tokens;
- DDP's exchange: a comm hook doing what DDP's default does (``default_hooks.allreduce_hook``), registered at a
  ``DistributedDataParallel`` model's first forward unless the script registered its own; the step's exposed
  exchange runs from the last bucket handed to it to the end of backward; with ``GPU_PREFLIGHT_DDP=skip`` (the
  exchange A/B's re-runs only) the hook hands each bucket back unreduced instead: the step without the exchange;
- ``DataLoader.__init__``: the settings each loader was built with, and the overrides verify asks for
  (``GPU_PREFLIGHT_LOADER``, a JSON object) applied at construction: the worker settings, and ``batch_size``
  (--sweep, the out-of-memory search) where the loader batches by ``batch_size`` (not with a ``batch_sampler``);
- with ``GPU_PREFLIGHT_MODEL`` set (verify's re-runs of a compute-bound command only), at the first optimizer
  step the models it steps (the outermost live ``nn.Module``s holding its parameters) get the change asked:
  their ``forward`` under ``torch.autocast`` (``{"autocast": "bf16"}``), ``channels_last`` weights and inputs,
  or ``Module.compile()``; one ``model-change`` line says what was changed and whether they hold 4-D weights;
  ``{"autocast": "off"}`` (a CPU run in bf16 on a CPU that emulates it) turns the script's own bf16 autocast
  regions on that device off instead, and one ``autocast-off`` line says the first one was;
- a map-style dataset's cost, split (``_MapDatasetFetcher.fetch``): the samples' ``__getitem__``/``__getitems__``
  and the ``collate_fn``, as step fields in the training process (``num_workers=0``) and one ``fetch`` line per
  batch in each DataLoader worker (forked or spawned, the agent runs there too); with ``GPU_PREFLIGHT_SPLIT``
  set (the measured run), a sample of those batches also has each step of the dataset's transform pipeline timed
  (a ``Compose``-like object's ``.transforms`` list, swapped in place for timing wrappers during the batch): one
  ``transforms`` line per sampled batch, from whichever process built it;
- with ``GPU_PREFLIGHT_PEAK`` set (the sweep's re-runs only: it resets torch's peak statistics, which the
  script might read itself), each step's CUDA allocator peak (``torch.cuda.max_memory_reserved``);
- on CUDA only (a process whose script initialised CUDA itself), the caching allocator's figures: ``memory``
  lines (``torch.cuda.memory_stats``, ``mem_get_info``: the figures the near-oom rule reads) read at a step's end
  at most every ``MEMORY_EVERY_S`` and written when they changed, and one at exit (its counters then: peaks,
  retries, out-of-memory errors; the current figures of the last step's end, while the training state lived);
- on CUDA only, with ``GPU_PREFLIGHT_PROFILE_STEP`` set (verify's measured run, a warm-up step before the one
  whose FLOPs are counted), that one step under ``torch.profiler`` (CUDA activity only): one ``kernels`` line,
  the kernels' count, median duration, short kernels' share of their time and the share of the step's compute
  window (forward + backward + optimizer) the GPU spent in a kernel (the launch-bound rule's inputs).

A script may mark what no hook sees, and nothing happens outside verify: ``region("h2d")`` (a part of the step
under verify's name for it), ``data(batches)`` (each batch's wait as data wait, for loops without torch's
DataLoader), ``step()`` (a step without a torch optimizer), ``phase("eval")`` (a part that is not a training
step: out of the step's time, one ``phase`` line), and it may ask ``should_stop()`` (True once verify has what it
needs: the stop file ``STOP_FILE`` in the events folder, which verify writes before it signals a script that asked).

Time is exclusive: a nested region pauses its parent, so the parts of a step add up to the step. What no
hook or mark covers (the forward pass, the loss, ``.to(device)``, logging) is "forward": the step minus the rest.
Each step is one JSON line in ``GPU_PREFLIGHT_EVENTS/events-<pid>.jsonl``. On the CPU the clock is
``time.monotonic()``; once CUDA is initialised, each boundary is also a CUDA event on the current stream, and a
step's line is written when its last event has completed (``query()``, never a synchronize; at exit one).
Global module hooks are not installed: any one of them turns off ``nn.Module``'s fast call path for every
submodule call, and full backward hooks break in-place operations.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EVENTS_ENV = "GPU_PREFLIGHT_EVENTS"
LOADER_ENV = "GPU_PREFLIGHT_LOADER"
COUNT_ENV = "GPU_PREFLIGHT_COUNT_STEP"  # the (warm-up) optimizer step whose matrix FLOPs are counted, for MFU
PEAK_ENV = "GPU_PREFLIGHT_PEAK"  # "1": each step's line holds the CUDA allocator's peak (the peak is reset per step)
MODEL_ENV = "GPU_PREFLIGHT_MODEL"  # a JSON object: the model-side change of a re-run (autocast, channels_last, compile)
DDP_ENV = "GPU_PREFLIGHT_DDP"  # "skip": the exchange A/B's other leg, each gradient bucket handed back unreduced
PROFILE_ENV = "GPU_PREFLIGHT_PROFILE_STEP"  # the (warm-up) optimizer step whose CUDA kernels are profiled (CUDA only)
# "N" (the measured run only): every Nth batch a process fetches from a map-style dataset, from its second on (the
# first carries one-time costs: lazy imports, caches), has each step of the dataset's transform pipeline timed.
SPLIT_ENV = "GPU_PREFLIGHT_SPLIT"
TRANSFORM_ATTRS = ("transform", "transforms")  # where datasets keep their pipeline (torchvision's: ``transform``)
# The allocator's figures are read at a step's end at most this often (one memory_stats call: well under a
# millisecond), and a line written only when they changed.
MEMORY_EVERY_S = 1.0
SHORT_KERNEL_NS = 10_000  # HTA's "short kernels": launches cost 5-20 µs on the host (docs/sources.md#hta)
_DONE = "_gpu_preflight_armed"
# Step lines are written in batches, at most this often (and all at exit): one line a step, serialised and
# written as the step ended, was most of the agent's cost on a sub-millisecond step (BENCHMARKS.md, "verify --
# COMMAND overhead"); verify's stop then sees a step up to this much later.
FLUSH_S = 0.2
STOP_FILE = "stop"  # verify's request to stop, in the events folder: {"at": N}, the step count to stop at
LISTENING = "listening-{pid}"  # a process whose script asked should_stop(): verify asks before it signals
# should_stop() reads the stop file at most this often (one stat a call would cost ~1 µs on a sub-ms step);
# verify allows for it in the step it asks for (checks/verify/user/launch.py, ASK_LAG_S).
STOP_READ_S = 0.05
PHASE_PREFIX = "phase:"  # a region under a script's phase(): out of the step, one ``phase`` line at its end


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps with options builds one a call


class _Writer:
    """One JSON-lines file per process (a forked child opens its own on its first line)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.pid = folder, -1
        self.fh: Any = None

    def __call__(self, event: str, **data: Any) -> None:
        if self.pid != os.getpid():
            self.pid = os.getpid()
            path = os.path.join(self.folder, f"events-{self.pid}.jsonl")
            self.fh = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives with the process
        assert self.fh is not None
        self.fh.write(_ENCODE({"event": event, "t": time.monotonic(), "pid": self.pid, **data}) + "\n")


class _WhenImported:
    """A ``sys.meta_path`` finder that runs a callback right after a module's own code has run."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.callbacks:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real = loader.exec_module
        callback = self.callbacks.pop(name)

        def exec_module(module: Any) -> None:
            real(module)
            loader.__dict__.pop("exec_module", None)
            _safely(callback, module)

        loader.exec_module = exec_module
        return spec


def _safely(fn: Callable[..., Any], *args: Any) -> Any:
    """Instrumentation never breaks the user's run: a failure is one event line, not an exception."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported to verify, the user's code goes on
        _say("agent-error", where=getattr(fn, "__name__", "?"), error=f"{type(exc).__name__}: {exc}"[:300])
        return None


_say: Callable[..., None] = lambda event, **data: None  # noqa: E731 - replaced by arm()


def arm() -> None:
    """Watch for torch (and the checkpoint modules) being imported; hook them then, or now if already there."""
    global _say, _ASK
    if getattr(sys, _DONE, False):
        return
    setattr(sys, _DONE, True)
    _say = _Writer(os.environ[EVENTS_ENV])
    _ASK = _Ask(os.environ[EVENTS_ENV])
    if _main_process() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background by a shell: verify stops the run with SIGINT, so the script must hear it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    callbacks: dict[str, Callable[[Any], None]] = {
        "torch": _on_torch,
        "torch.nn.parallel.distributed": _on_ddp,
        "torch.distributed.checkpoint": _on_dcp,
        "safetensors.torch": _on_safetensors,
        "accelerate.accelerator": _on_accelerate,
        "lightning.pytorch.trainer.trainer": _on_lightning_trainer,
        "pytorch_lightning.trainer.trainer": _on_lightning_trainer,
        "lightning.fabric.plugins.io.torch_io": _on_lightning_io,
        "lightning_fabric.plugins.io.torch_io": _on_lightning_io,
        "transformers.trainer": _on_transformers_trainer,
    }
    for name in [n for n in callbacks if n in sys.modules]:
        _safely(callbacks.pop(name), sys.modules[name])
    sys.meta_path.insert(0, _WhenImported(callbacks))


def _main_process() -> bool:
    return "--multiprocessing-fork" not in sys.argv


def _rank() -> dict[str, int | None]:
    def num(name: str) -> int | None:
        value = os.environ.get(name, "")
        return int(value) if value.isdigit() else None

    return {
        "rank": num("RANK"),
        "local_rank": num("LOCAL_RANK"),
        "world_size": num("WORLD_SIZE"),
        "local_world_size": num("LOCAL_WORLD_SIZE"),  # the ranks on this node: what verify here can see step
    }


class _Steps:
    """Exclusive time by region between optimizer steps; one record per step."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cuda: bool | None = None  # decided at the first step: CUDA events, or host clocks alone
        self.stack: list[list[Any]] = []  # [region, depth]
        self.since = self.mark()
        self.segments: list[tuple[str, Any, Any]] = []
        self.counts: dict[str, int] = {}  # __next__ calls per loader over the run
        self.step_counts: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.micro = 0
        self.ckpt_bytes = 0
        self.saves = 0
        self.save: _Save | None = None  # the outermost checkpoint call in progress
        self.loss: Any = None
        self.i = 0
        self.pending: list[dict[str, Any]] = []
        self.flushed = 0.0  # when the step lines were last written
        self.rank = _rank()  # torchrun sets it before the script starts: read once
        self.comm_mark: Any = None  # when DDP's last gradient bucket of this step was handed to the all-reduce
        self.comm_bytes = 0  # the buckets' bytes this step
        self.comm_hooked = False  # our timing hook is DDP's comm hook (not when the script registers its own)
        self.amp: dict[str, str] = {}  # device type -> "bf16"/"fp16" of the autocast regions entered this step
        self.weights: str | None = None  # dtype of the optimizer's first parameter
        count = os.environ.get(COUNT_ENV, "")
        self.count_at = int(count) if count.isdigit() else 0
        self.counter: Any = None
        self.peak = os.environ.get(PEAK_ENV) == "1"
        text = os.environ.get(MODEL_ENV, "")
        self.model_change: dict[str, Any] | None = json.loads(text) if text else None  # applied once, then None
        self.fetch_cost: dict[str, list[float]] = {}  # feed -> [samples, batches, __getitem__ s, collate s]
        profile = os.environ.get(PROFILE_ENV, "")
        self.profile_at = int(profile) if profile.isdigit() else 0
        self.profiler: Any = None  # torch.profiler.profile while the step self.profile_at runs
        self.memory: dict[str, Any] | None = None  # the allocator's figures at the last step end read (CUDA only)
        self.memory_read = 0.0  # when (monotonic)
        self.memory_said: tuple[Any, ...] | None = None  # the figures of the last memory line written
        self.peaks = [0, 0]  # with self.peak (peaks reset every step): the largest reserved, allocated peaks seen
        self.phases: list[str] = []  # the script's open phases (``phase``), outermost first
        self.phase_since = 0.0  # when the outermost one began (monotonic)

    def mark(self) -> tuple[float, Any]:
        event = None
        if self.cuda:  # the device's clock: host timers would put queued GPU work in the wrong phase
            event = self.torch.cuda.Event(enable_timing=True)  # docs/sources.md#gpu-clock-timers
            event.record()
        return time.monotonic(), event

    def enter(self, region: str) -> None:
        if self.phases:  # inside a phase everything is the phase's: an eval loader's wait, a save
            region = PHASE_PREFIX + self.phases[0]
        if self.stack and self.stack[-1][0] == region:
            self.stack[-1][1] += 1
            return
        now = self.mark()
        self.segments.append((self.stack[-1][0] if self.stack else "rest", self.since, now))
        self.stack.append([region, 1])
        self.since = now

    def leave(self, region: str) -> None:
        if self.phases:
            region = PHASE_PREFIX + self.phases[0]
        stack = self.stack
        if not stack or stack[-1][0] != region:
            if not any(s[0] == region for s in stack):
                return
            while stack[-1][0] != region:  # an exception skipped a leave (a failed step)
                stack.pop()
        stack[-1][1] -= 1
        if stack[-1][1]:
            return
        now = self.mark()
        self.segments.append((region, self.since, now))
        self.stack.pop()
        self.since = now

    def enter_phase(self, name: str) -> None:
        if not self.phases:
            self.phase_since = time.monotonic()
        self.phases.append(name)
        self.enter(name)  # under the outermost phase's name

    def leave_phase(self, name: str) -> None:
        if name not in self.phases:
            return
        self.leave(name)
        del self.phases[len(self.phases) - 1 - self.phases[::-1].index(name) :]  # and any left open inside it
        if not self.phases:
            _say("phase", name=name, seconds=time.monotonic() - self.phase_since, step=self.i, **self.rank)

    def begin_step(self) -> None:
        if self.cuda is None:
            self.cuda = bool(self.torch.cuda.is_available() and self.torch.cuda.is_initialized())
            if self.cuda:  # the step's first boundary needs an event too
                self.since = self.mark()
            _safely(self.describe_device)
        if self.stack:  # a step that raised left its region open
            self.stack = [s for s in self.stack if s[0] != "optimizer"]
        self.enter("optimizer")

    def describe_device(self) -> None:
        device: dict[str, Any] = {"type": "cuda" if self.cuda else "cpu", "name": "CPU", "uuid": None}
        if self.cuda:
            index = self.torch.cuda.current_device()
            props = self.torch.cuda.get_device_properties(index)
            device |= {"name": props.name, "uuid": f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None}
            device["index"] = index  # torch's index on this host (the straggler verdict names the GPU)
        _say("device", **device, **_rank())

    def end_step(self, optimizer: bool = True) -> None:
        if self.phases:  # a step inside a phase (an evaluation's, a warm-up the script set apart) is not a step
            if optimizer:
                self.leave("optimizer")
            return
        if optimizer:
            self.leave("optimizer")
        elif self.cuda is None:
            self.cuda = bool(self.torch.cuda.is_available() and self.torch.cuda.is_initialized())
            _safely(self.describe_device)
        if self.cuda and self.profile_at > 1 and self.i + 2 == self.profile_at:
            # before this step's end: the profiler's start-up (CUPTI's) lands in this step, not the profiled one
            _safely(self.start_profile)
        now = self.mark()
        self.segments.append((self.stack[-1][0] if self.stack else "rest", self.since, now))
        self.since = now
        self.i += 1
        self.pending.append(
            {
                "i": self.i,
                "segments": self.segments,
                "micro": self.micro,
                "loss": self.loss,
                "step_counts": self.step_counts,
                "samples": self.samples,
                "tokens": self.tokens,
                "saves": self.saves,
                "ckpt_bytes": self.ckpt_bytes,
                "comm_mark": self.comm_mark,
                "comm_bytes": self.comm_bytes,
                "precision": self.precision(),
                "peak_bytes": _safely(self.peak_bytes) if self.peak and self.cuda else None,
                "fetch_cost": self.fetch_cost,
            }
        )
        self.fetch_cost = {}
        self.amp = {}
        if self.profiler is not None and self.i >= self.profile_at:
            _safely(self.stop_profile)  # synchronizes: in the next (warm-up) step's time
        if self.cuda and now[0] - self.memory_read >= MEMORY_EVERY_S:
            _safely(self.read_memory)
        if self.counter is not None:
            _safely(self.stop_count)
        if self.count_at and self.i == self.count_at - 1:
            _safely(self.start_count)
        self.segments, self.step_counts, self.samples, self.tokens = [], {}, {}, {}
        self.micro = self.saves = self.ckpt_bytes = self.comm_bytes = 0
        self.comm_mark = None
        self.loss = None
        self.flush(wait=False)

    def peak_bytes(self) -> int:
        """The CUDA allocator's peak over this step (reserved: what the device must hold), then reset."""
        stats = self.torch.cuda.memory_stats()
        peak = int(stats.get("reserved_bytes.all.peak", 0))
        self.peaks = [max(self.peaks[0], peak), max(self.peaks[1], int(stats.get("allocated_bytes.all.peak", 0)))]
        self.torch.cuda.reset_peak_memory_stats()
        return peak

    def read_memory(self) -> None:
        """The allocator's figures at this step's end; a ``memory`` line when they changed since the last one."""
        self.memory_read = time.monotonic()
        self.memory = figures = self.with_peaks(memory_figures(self.torch))
        said = tuple(figures.get(k) for k in MEMORY_CHANGES)
        if said != self.memory_said:
            self.memory_said = said
            _say("memory", **figures, step=self.i, at="step", **self.rank)

    def memory_at_exit(self) -> None:
        """One last ``memory`` line where the script initialised CUDA: the counters as they ended (peaks, retries,
        out-of-memory errors: an OOM before any step included), the current figures of the last step's end read
        (at exit the script's tensors may be gone already, and allocated would read as fragmentation)."""
        if not self.torch.cuda.is_initialized():
            return
        figures = self.with_peaks(memory_figures(self.torch))
        if self.memory is not None:
            figures |= {k: self.memory[k] for k in MEMORY_CURRENT}
        _say("memory", **figures, step=self.i, at="exit", **self.rank)

    def with_peaks(self, figures: dict[str, Any]) -> dict[str, Any]:
        """With per-step peaks (``GPU_PREFLIGHT_PEAK``: reset at every step), the largest of them."""
        reserved, allocated = self.peaks
        figures["peak_reserved_bytes"] = max(figures["peak_reserved_bytes"], reserved)
        figures["peak_allocated_bytes"] = max(figures["peak_allocated_bytes"], allocated)
        return figures

    def start_profile(self) -> None:
        """``torch.profiler`` (CUDA activity only: no shapes, stacks or memory) from here to the next step's end;
        not where the script runs a profiler of its own (one at a time)."""
        torch = self.torch
        if torch.autograd.profiler._is_profiler_enabled:
            _say("kernels", step=self.profile_at, note="not profiled: the script runs torch.profiler itself",
                 **self.rank)  # fmt: skip
            return
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        profiler.start()
        self.profiler = profiler

    def stop_profile(self) -> None:
        """Stop the profiler (it synchronizes) and keep the profiled step's kernels for its step line (the step's
        compute window is known once its CUDA events are read)."""
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        events = profiler.profiler.kineto_results.events()
        self.pending[-1]["kernels"] = kernel_intervals(events, self.torch.autograd.DeviceType.CUDA)

    def say_kernels(self, kernels: list[tuple[int, int]], line: dict[str, Any]) -> None:
        compute_s = line["forward"] + line["backward"] + line["optimizer"]
        _say("kernels", step=line["i"], **kernel_summary(kernels, compute_s), **self.rank)

    def precision(self) -> str | None:
        """The math of this step: the autocast dtype on its device, else the weights' dtype (fp32 as tf32 when
        torch.set_float32_matmul_precision lets matmuls use TF32)."""
        device = "cuda" if self.cuda else "cpu"
        if self.amp.get(device):
            return self.amp[device]
        if self.weights == "fp32" and self.cuda and self.torch.get_float32_matmul_precision() != "highest":
            return "tf32"
        return self.weights

    def start_count(self) -> None:
        """Count the next step's matrix FLOPs (forward, backward, optimizer) with torch's FLOP formulas, in a
        dispatch mode of our own: torch's FlopCounterMode would also install global module hooks."""
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and getattr(dynamo, "utils", None) and dynamo.utils.counters["stats"]["unique_graphs"]:
            _say("flops", flops=None, note="not counted: the model is compiled (torch.compile)", **self.rank)
            return
        self.counter = _flop_counter(self.torch)
        self.counter.__enter__()

    def stop_count(self) -> None:
        counter, self.counter = self.counter, None
        counter.__exit__(None, None, None)
        # missed: ops whose formula could not read their arguments (the count is a lower bound by their FLOPs)
        _say("flops", step=self.i, flops=int(counter.flops), missed=int(counter.missed), ops=int(counter.ops),
             **self.rank)  # fmt: skip

    def flush(self, wait: bool) -> None:
        """Write the steps whose clocks are readable (CUDA: their last event completed), at most every
        ``FLUSH_S`` (at exit: all of them)."""
        now = time.monotonic()
        if not wait and now - self.flushed < FLUSH_S:
            return
        self.flushed = now
        if wait and self.cuda:
            self.torch.cuda.synchronize()
        ready = 0
        for raw in self.pending:
            last = raw["segments"][-1][2][1]
            if last is not None and not wait and not last.query():
                break
            ready += 1
        done, self.pending[:ready] = self.pending[:ready], []
        for raw in done:
            line = self.record(raw)
            _say("step", **line)
            if raw.get("kernels") is not None:
                _safely(self.say_kernels, raw["kernels"], line)

    def seconds(self, a: tuple[float, Any], b: tuple[float, Any]) -> float:
        if a[1] is not None and b[1] is not None:
            return float(a[1].elapsed_time(b[1])) / 1000.0
        return b[0] - a[0]

    def record(self, raw: dict[str, Any]) -> dict[str, Any]:
        by: dict[str, float] = {}
        fetch: dict[str, list[list[float]]] = {}
        cuda = self.cuda
        for region, a, b in raw["segments"]:
            by[region] = by.get(region, 0.0) + (self.seconds(a, b) if cuda else b[0] - a[0])
            if region.startswith("data:"):
                fetch.setdefault(region, []).append([a[0], b[0]])
        feed = max(self.counts, key=lambda k: self.counts[k]) if self.counts else None
        data = by.get(feed, 0.0) if feed else 0.0
        other = {k: v for k, v in by.items() if k.startswith("data:") and k != feed}
        h2d = by.get("h2d", 0.0)  # only where the script marks it: region("h2d")
        named = data + h2d + by.get("backward", 0.0) + by.get("optimizer", 0.0) + by.get("checkpoint", 0.0)
        total = sum(v for k, v in by.items() if not k.startswith(PHASE_PREFIX))  # a phase is not the step's
        host_start, host_end = raw["segments"][0][1][0], raw["segments"][-1][2][0]
        host_fetch = sum(b - a for a, b in fetch.get(feed or "", []))
        host_phases = sum(b[0] - a[0] for r, a, b in raw["segments"] if r.startswith(PHASE_PREFIX))
        loss = raw["loss"]
        # DDP's exposed exchange: from the last bucket handed to the all-reduce to the end of that backward (the
        # reducer waits there for every bucket's result); None without our hook (no DDP, or the script's own hook).
        comm = None
        if self.comm_hooked and raw["comm_mark"] is not None:
            ends = [b for region, _, b in raw["segments"] if region == "backward" and b[0] >= raw["comm_mark"][0]]
            comm = self.seconds(raw["comm_mark"], ends[0]) if ends else None
        return {
            "i": raw["i"],
            "data_wait": data,
            "h2d": h2d,
            "forward": max(0.0, total - named),
            "backward": by.get("backward", 0.0),
            "optimizer": by.get("optimizer", 0.0),
            "checkpoint": by.get("checkpoint", 0.0),
            "forward_explicit": by.get("forward", 0.0),
            "other_loaders": round(sum(other.values()), 7),
            "host_start": host_start,
            "host_end": host_end,
            "enqueue_s": max(0.0, host_end - host_start - host_fetch - host_phases),
            "fetch": fetch.get(feed or "", []),
            "loss": float(loss) if loss is not None else None,
            "micro": raw["micro"],
            "batches": raw["step_counts"].get(feed or "", 0),
            "samples": raw["samples"].get(feed or "", 0),
            "tokens": raw["tokens"].get(feed or "", 0),
            "feed": feed,
            "saves": raw["saves"],
            "ckpt_bytes": raw["ckpt_bytes"],
            "clock": "cuda-events" if self.cuda else "monotonic",
            "precision": raw["precision"],
            "comm_exposed": None if comm is None else max(0.0, comm),
            "comm_bytes": raw["comm_bytes"] if self.comm_hooked else None,
            "peak_bytes": raw["peak_bytes"],
            **_fetch_fields(raw.get("fetch_cost", {}).get(feed or "")),
            **self.rank,
        }

    def fetched_in(self, key: str, samples: int, items_s: float, collate_s: float, worker: Any) -> None:
        """One batch built by a map-style fetcher: its samples' time and its collate's, in this step's totals (the
        training process), or one ``fetch`` line (a DataLoader worker: it has no steps, and may be killed)."""
        if worker is not None:
            _say("fetch", feed=key, ppid=os.getppid(), worker=worker.id, workers=worker.num_workers, samples=samples,
                 getitem_s=items_s, collate_s=collate_s)  # fmt: skip
            return
        row = self.fetch_cost.setdefault(key, [0, 0, 0.0, 0.0])
        row[0] += samples
        row[1] += 1
        row[2] += items_s
        row[3] += collate_s

    def fetched(self, key: str, batch: Any, hint: Any = None) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.step_counts[key] = self.step_counts.get(key, 0) + 1
        n = _batch_size(self.torch, batch, hint)
        if n:
            self.samples[key] = self.samples.get(key, 0) + n
        tokens = _tokens(self.torch, batch)
        if tokens:
            self.tokens[key] = self.tokens.get(key, 0) + tokens


# The allocator's figures of a memory line (checks/verify/diagnosis.py's near-oom rule reads them): those that are
# the state now (at a step's end) and those whose change writes a new line.
MEMORY_CURRENT = ("free_bytes", "allocated_bytes", "reserved_bytes", "inactive_split_bytes")
MEMORY_CHANGES = (
    *("total_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes"),
    *("num_alloc_retries", "num_ooms", "num_device_alloc"),
)


def memory_figures(torch: Any) -> dict[str, Any]:
    """The CUDA caching allocator's figures on the current device (docs/sources.md#cuda-memory-stats): one
    ``memory_stats`` call and the device's free and total memory."""
    stats = torch.cuda.memory_stats()
    try:
        free, total = torch.cuda.mem_get_info()
    except Exception:  # noqa: BLE001 - a broken context at exit: the card's size still reads
        free, total = None, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return {
        "total_bytes": int(total),
        "free_bytes": None if free is None else int(free),
        "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "peak_reserved_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "inactive_split_bytes": int(stats.get("inactive_split_bytes.all.current", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "num_device_alloc": stats.get("num_device_alloc"),
    }


def kernel_intervals(events: Any, cuda: Any) -> list[tuple[int, int]]:
    """The GPU kernels among a profile's events (``kineto_results.events()``: device ``cuda``), as (start, end)
    nanoseconds; copies and memsets left out (``Memcpy HtoD``, ``Memset``: not computation)."""
    return [
        (int(e.start_ns()), int(e.end_ns()))
        for e in events
        if e.device_type() == cuda and not e.name().startswith(("Memcpy", "Memset"))
    ]


def kernel_summary(kernels: list[tuple[int, int]], compute_s: float, steps: int = 1) -> dict[str, Any]:
    """Kernels per step, median duration, short kernels' share of the kernel time, and the share of the compute
    window some kernel ran (the union of their intervals: overlapping streams count once; Kineto's GPU util).
    The built-in loop's summary (its ``extras.kernel_summary``), over ``steps`` profiled steps."""
    import statistics

    if not kernels:  # CUPTI unavailable (containers without the profiling capability): abstain, never "0% busy"
        return {"steps": steps, "kernels_per_step": 0.0, "median_kernel_us": None, "busy_fraction": None,
                "short_kernel_time_share": None, "note": "the profiler recorded no kernels"}  # fmt: skip
    durations = sorted(b - a for a, b in kernels)
    total = sum(durations)
    short = sum(d for d in durations if d < SHORT_KERNEL_NS)
    busy_s = _union_ns(kernels) / 1e9
    return {
        "steps": steps,
        "kernels_per_step": len(durations) / max(1, steps),
        "median_kernel_us": statistics.median(durations) / 1e3,
        "short_kernel_time_share": short / total if total else None,
        "busy_fraction": min(1.0, busy_s / compute_s) if compute_s > 0 else None,
    }


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of (start, end) intervals (``checks.verify.figures.union_length``)."""
    covered, end = 0, None
    for a, b in sorted(intervals):
        if end is not None and b <= end:
            continue
        covered += b - (a if end is None else max(a, end))
        end = b
    return covered


def _fetch_fields(cost: list[float] | None) -> dict[str, Any]:
    """A step's map-style fetches from the batches' own loader in this process: samples, batches, seconds in the
    samples' ``__getitem__``/``__getitems__`` and in the collate (none: the loader has workers, or is iterable)."""
    if not cost:
        return {}
    return {
        "fetched_samples": int(cost[0]),
        "fetched_batches": int(cost[1]),
        "getitem_s": cost[2],
        "collate_s": cost[3],
    }


def _patch_fetch(torch: Any, st: _Steps) -> None:
    """``_MapDatasetFetcher.fetch``: the collate timed by wrapping the fetcher's ``collate_fn`` for the call, the
    samples (``__getitem__``/``__getitems__``) as the rest of it. A worker inherits the patch (fork) or makes its
    own when it imports torch (spawn, forkserver: the start-up file runs there too)."""
    import importlib

    fetcher = importlib.import_module("torch.utils.data._utils.fetch")._MapDatasetFetcher
    worker_info = importlib.import_module("torch.utils.data._utils.worker").get_worker_info
    real = fetcher.fetch
    every = os.environ.get(SPLIT_ENV, "")
    sample = _Sampled(int(every)) if every.isdigit() and int(every) > 0 else None

    @functools.wraps(real)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        collate, spent = self.collate_fn, [0.0]

        def timed_collate(data: Any) -> Any:
            a = time.monotonic()
            try:
                return collate(data)
            finally:
                spent[0] += time.monotonic() - a

        split = _Split.of(self.dataset) if sample is not None and sample.due() else None
        self.collate_fn = timed_collate
        a = time.monotonic()
        try:
            batch = real(self, possibly_batched_index)
        finally:
            self.collate_fn = collate
            if split is not None:
                split.put_back()
        took = time.monotonic() - a
        n = len(possibly_batched_index) if self.auto_collation else 1
        key, worker = f"data:{id(self.dataset)}", worker_info()
        _safely(st.fetched_in, key, n, took - spent[0], spent[0], worker)
        if split is not None:
            _safely(split.say, key, n, took - spent[0], worker)
        return batch

    fetcher.fetch = fetch


class _Sampled:
    """Which batches this process fetches get their transforms timed: every ``every``-th from the second on,
    counted per process (a forked worker starts its own count)."""

    def __init__(self, every: int) -> None:
        self.every, self.pid, self.n = every, -1, 0

    def due(self) -> bool:
        if self.pid != os.getpid():
            self.pid, self.n = os.getpid(), 0
        self.n += 1
        return self.n % self.every == 2 % self.every


class _Timed:
    """A transform that adds its own time to ``spent[k]``; other attributes are the transform's own."""

    def __init__(self, inner: Any, spent: list[float], k: int) -> None:
        self.inner, self.spent, self.k = inner, spent, k

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        a = time.monotonic()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.spent[self.k] += time.monotonic() - a

    def __getattr__(self, name: str) -> Any:
        if "inner" not in self.__dict__:  # copy and pickle ask before __init__ ran
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)


class _Split:
    """One batch's transforms timed: each step of the dataset's pipeline swapped for a ``_Timed`` in its own
    container (a ``Compose``-like object's ``.transforms`` list, in place; or the dataset's ``__dict__`` for one
    callable ``transform``) until ``put_back``. Where the pipeline is: ``_pipeline``."""

    def __init__(self, slots: Any, keys: list[Any], method: str, where: str) -> None:
        self.slots, self.keys, self.method, self.where = slots, keys, method, where
        self.originals = [slots[k] for k in keys]
        self.names = [_step_name(t) for t in self.originals]
        self.spent = [0.0] * len(keys)

    @classmethod
    def of(cls, dataset: Any) -> _Split | None:
        """The dataset's pipeline with its steps timed from now on; None without one (its batch is fetched as it
        is: no pipeline, attributes that raise, a container that refuses the swap)."""
        try:
            found = _pipeline(dataset)
            if found is None:
                return None
            split = cls(*found)
        except Exception:  # noqa: BLE001 - a dataset whose attributes raise
            return None
        try:
            for i, k in enumerate(split.keys):
                split.slots[k] = _Timed(split.originals[i], split.spent, i)
        except Exception:  # noqa: BLE001 - the steps swapped so far go back
            _safely(split.put_back)
            return None
        return split

    def put_back(self) -> None:
        for k, t in zip(self.keys, self.originals, strict=True):
            self.slots[k] = t

    def say(self, feed: str, samples: int, getitem_s: float, worker: Any) -> None:
        _say("transforms", feed=feed, ppid=os.getppid(), worker=None if worker is None else worker.id,
             samples=samples, getitem_s=getitem_s, method=self.method, where=self.where, names=self.names,
             seconds=self.spent)  # fmt: skip


def _pipeline(dataset: Any) -> tuple[Any, list[Any], str, str] | None:
    """(container, keys, method, where) of the transforms ``dataset``'s ``__getitem__`` applies: a
    ``Compose``-like object (a ``.transforms`` list of callables, as torchvision's and many libraries' have) in
    its ``transform``/``transforms`` attribute, or the dataset's own ``.transforms`` list; else one callable in
    that attribute; looked for on the dataset, then one level in (a ``Subset``'s ``.dataset``)."""
    for ds in (dataset, getattr(dataset, "dataset", None)):
        if ds is None:
            continue
        owners = [(getattr(ds, a, None), f"{type(ds).__name__}.{a}") for a in TRANSFORM_ATTRS]
        for owner, where in [*owners, (ds, f"{type(ds).__name__}.transforms")]:
            steps = getattr(owner, "transforms", None)
            if isinstance(steps, list) and steps and all(callable(t) for t in steps):
                return steps, list(range(len(steps))), "compose", where
        own = getattr(ds, "__dict__", {})
        for a in TRANSFORM_ATTRS:
            if callable(own.get(a)) and not isinstance(own[a], type):
                return own, [a], "transform", f"{type(ds).__name__}.{a}"
    return None


def _step_name(t: Any) -> str:
    """A transform's name: its class's (``GaussianBlur``), a function's own, a ``functools.partial``'s function's."""
    inner = t.func if isinstance(t, functools.partial) else t
    name = getattr(inner, "__name__", None)  # a function's; an instance has none (its class has)
    return name if isinstance(name, str) else type(inner).__name__


def _batch_size(torch: Any, batch: Any, hint: Any = None, depth: int = 0) -> int | None:
    """The collated batch's batch dimension: the first dimension of its first tensor (a tensor, a tuple/list, a
    dict, a dataclass-like), or the count of its per-sample items where the collate keeps samples apart:
    ``(images, targets)`` tuples (``collate_fn=lambda b: tuple(zip(*b))``, detection's), or a tuple of same-shape
    per-sample tensors as long as the loader's ``batch_size`` (``hint``: its iterator), not an image's channels."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if depth > 3:
        return None
    if isinstance(batch, (list, tuple)):
        if not batch:
            return None
        first = batch[0]
        if isinstance(first, (list, tuple)) and first and all(isinstance(x, (torch.Tensor, dict)) for x in first):
            return len(first)  # a collate that keeps samples apart, (images, targets) tuples: not an image's channels
        if len(batch) > 1 and _per_sample(torch, batch) and len(batch) == _loader_batch(hint):
            return len(batch)
        items = list(batch[:8])
    elif isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        items = [batch[k] for k in list(batch.keys())[:8]]
    else:
        return None
    for item in items:
        n = _batch_size(torch, item, hint, depth + 1)
        if n:
            return n
    return None


def _per_sample(torch: Any, batch: Any) -> bool:
    """Tensors of one shape (one per sample, ``[image, image]``, if as many as the loader's batch size)."""
    first = batch[0]
    if not isinstance(first, torch.Tensor) or not first.dim():
        return False
    return all(isinstance(t, torch.Tensor) and t.shape == first.shape for t in batch)


TOKEN_KEYS = ("input_ids", "tokens", "token_ids", "input_tokens")  # a dict batch's token ids (transformers' name first)


def _tokens(torch: Any, batch: Any) -> int:
    """Tokens in a batch of token ids: an integer [B, T] tensor (any width), alone, first in a tuple/list (GPT's ``(x, y)``),
    or under ``TOKEN_KEYS`` in a dict (``input_ids``); 0 for anything else."""
    if isinstance(batch, (list, tuple)):
        batch = batch[0] if batch else None
    elif not isinstance(batch, torch.Tensor) and hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
        batch = next((batch[k] for k in TOKEN_KEYS if k in batch), None)
    if isinstance(batch, torch.Tensor) and batch.dim() == 2 and _integer(torch, batch.dtype):
        return int(batch.numel())
    return 0


def _integer(torch: Any, dtype: Any) -> bool:
    """Token ids of any integer width (stage-data writes uint16 or uint32 arrays, which collate keeps)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


_STEPS: _Steps | None = None


def _on_torch(torch: Any) -> None:
    """Install the hooks once torch is imported (ordinary torch imports: the user's process imports them anyway)."""
    global _STEPS
    import importlib

    st = _STEPS = _Steps(torch)
    optim = importlib.import_module("torch.optim.optimizer")
    optim.register_optimizer_step_pre_hook(functools.partial(_step_pre, st))
    optim.register_optimizer_step_post_hook(lambda opt, args, kwargs: _safely(st.end_step))
    dataloader = importlib.import_module("torch.utils.data.dataloader")
    _patch_next(dataloader._BaseDataLoaderIter, st)
    _patch_loader_init(dataloader.DataLoader)
    _patch_backward(torch, st)
    _safely(_patch_autocast, torch, st)
    _safely(_patch_fetch, torch, st)
    torch.save = _saving(torch.save, st, _arg(1, "f"), read_back=True)
    os.replace, os.rename = _following(os.replace), _following(os.rename)
    atexit.register(lambda: _safely(st.memory_at_exit))  # runs after the flush below (last registered, first run)
    atexit.register(lambda: _safely(st.flush, True))
    os.register_at_fork(after_in_child=st.pending.clear)  # a forked child writes none of its parent's steps
    ddp = sys.modules.get("torch.nn.parallel.distributed")  # torch imports it with torch.nn, before this runs
    if ddp is not None:
        _safely(_on_ddp, ddp)
    _say("hello", argv=sys.argv[:20], ppid=os.getppid(), pgid=os.getpgid(0), main=_main_process(), **_rank())
    _say("torch", version=str(torch.__version__))


REGIONS = ("h2d", "forward", "backward", "optimizer", "checkpoint")  # the step's parts a script may mark itself


class region:  # lower case: it reads as a function, ``with region("h2d"):``
    """Time a part of the step under one of verify's names (``REGIONS``; any other name counts as forward): the
    host-to-device copy most of all, which no hook can tell from the forward pass. Outside verify nothing happens:
    ``mark = getattr(sys.modules.get("_gpu_preflight_agent"), "region", None) or contextlib.nullcontext``.
    """

    def __init__(self, name: str) -> None:
        self.name = name if name in REGIONS else "forward"

    def __enter__(self) -> region:
        if _STEPS is not None:
            _safely(_STEPS.enter, self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if _STEPS is not None:
            _safely(_STEPS.leave, self.name)


def data(batches: Any, name: str = "") -> Any:
    """Iterate ``batches`` timing each one's wait as data wait and counting its samples, as torch's DataLoader is
    timed: for loops that build their batches otherwise (a generator, an ``IterableDataset`` iterated by hand, the
    tool's ``staged_loader``). Outside verify it is the iterable itself:
    ``for x, y in getattr(sys.modules.get("_gpu_preflight_agent"), "data", lambda b, name="": b)(batches):``
    """
    st = _STEPS
    if st is None:
        return batches
    return _timed_batches(st, iter(batches), f"data:{name or id(batches)}")


def _timed_batches(st: _Steps, it: Any, key: str) -> Any:
    try:
        while True:
            st.enter(key)
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                st.leave(key)
            _safely(st.fetched, key, batch)
            yield batch
    finally:  # a loop broken off closes the source too (its own clean-up runs: threads, files)
        close = getattr(it, "close", None)
        if close is not None:
            close()


def step() -> None:
    """The marker for a loop without a torch optimizer (a hand-written update): one call ends one step.

    One line in the user's loop, harmless without verify:
    ``getattr(sys.modules.get("_gpu_preflight_agent"), "step", lambda: None)()``
    """
    if _STEPS is not None:
        _safely(_STEPS.end_step, False)


class phase:  # lower case: it reads as a function, ``with phase("eval"):``
    """Mark a part of the run that is not a training step: an evaluation, a checkpoint round, a warm-up the
    script sets apart. Its time is left out of the step it falls in (the step's parts add up without it), the
    hooks inside it count for it (an eval loader's wait, its saves), and an optimizer step inside it is not a
    step; each time it ends, one ``phase`` line (name, seconds, the steps done before it). Nested phases are the
    outermost's. Outside verify nothing happens:
    ``phase = getattr(sys.modules.get("_gpu_preflight_agent"), "phase", None) or (lambda name: contextlib.nullcontext())``
    """

    def __init__(self, name: str) -> None:
        self.name = str(name) or "phase"

    def __enter__(self) -> phase:
        if _STEPS is not None:
            _safely(_STEPS.enter_phase, self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if _STEPS is not None:
            _safely(_STEPS.leave_phase, self.name)


class _Ask:
    """verify's request to stop, as ``should_stop`` reads it: the stop file of the events folder, read at most
    every ``STOP_READ_S`` until it is there, then never again."""

    def __init__(self, folder: str) -> None:
        self.folder, self.read_at, self.at = folder, -STOP_READ_S, -1
        self.told = False

    def __call__(self) -> bool:
        if not self.told:  # verify asks only a script that listens (else it signals at once, as before)
            self.told = True
            with contextlib.suppress(OSError):
                open(os.path.join(self.folder, LISTENING.format(pid=os.getpid())), "w").close()
        if self.at < 0:
            now = time.monotonic()
            if now - self.read_at < STOP_READ_S:
                return False
            self.read_at = now
            try:
                with open(os.path.join(self.folder, STOP_FILE), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                return False
            try:
                self.at = max(0, int(json.loads(text)["at"]))
            except (ValueError, KeyError, TypeError):
                self.at = 0  # unreadable: stop now
        return (_STEPS.i if _STEPS is not None else 0) >= self.at


_ASK: _Ask | None = None


def should_stop() -> bool:
    """True once verify has what it needs: the script leaves its loop there and ends as it would (its own save,
    its own exit) instead of being interrupted. Cheap enough for every step (a clock read; the stop file is read
    at most every ``STOP_READ_S``). Under torchrun every rank turns True at the same step count (verify asks for
    a step a little ahead of the ranks), so they leave their loops together. Outside verify it is always False:
    ``should_stop = getattr(sys.modules.get("_gpu_preflight_agent"), "should_stop", lambda: False)``
    """
    return _ASK() if _ASK is not None else False


_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.float64": "fp64"}


def _step_pre(st: _Steps, opt: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if st.model_change is not None:
        wanted, st.model_change = st.model_change, None
        _safely(_change_model, st.torch, opt, wanted)
    _safely(st.begin_step)
    if st.weights is None and opt.param_groups and opt.param_groups[0]["params"]:
        st.weights = _DTYPES.get(str(opt.param_groups[0]["params"][0].dtype))
    closure = kwargs.get("closure") if "closure" in kwargs else (args[0] if args else None)
    if not callable(closure):
        return None
    timed = _timed(closure, st, "forward")  # Lightning: forward and backward run inside optimizer.step
    return (args, {**kwargs, "closure": timed}) if "closure" in kwargs else ((timed, *args[1:]), kwargs)


def _change_model(torch: Any, opt: Any, wanted: dict[str, Any]) -> None:
    """Apply a re-run's model-side change to the outermost live modules that hold the optimizer's parameters."""
    import gc

    params = {id(p) for group in opt.param_groups for p in group["params"]}
    module = torch.nn.Module
    owning = [
        o for o in gc.get_objects() if issubclass(type(o), module) and any(id(p) in params for p in o.parameters())
    ]
    inner = {id(c) for m in owning for c in m.modules() if c is not m}
    roots = [m for m in owning if id(m) not in inner]
    conv = any(p.dim() == 4 for m in roots for p in m.parameters())
    for m in roots:
        if wanted.get("channels_last") and conv:
            m.to(memory_format=torch.channels_last)
            _wrap_forward(m, functools.partial(_channels_last_inputs, torch))
        if wanted.get("autocast") == "off":
            _autocast_off(torch, next(m.parameters()).device.type)
        elif wanted.get("autocast"):
            device = next(m.parameters()).device.type
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[wanted["autocast"]]
            _wrap_forward(m, functools.partial(_under_autocast, torch, device=device, dtype=dtype))
        if wanted.get("compile"):
            m.compile()
    _say("model-change", asked=wanted, models=[type(m).__name__ for m in roots], conv=conv, **_rank())


def _autocast_off(torch: Any, device: str) -> None:
    """The script's own bf16 autocast regions on ``device`` entered disabled (the math runs in the weights' fp32);
    one ``autocast-off`` line at the first (none: the run's bf16 was not autocast's, bf16 weights say)."""
    cls = torch.amp.autocast_mode.autocast
    if getattr(cls, "_gpu_preflight_off", None) == device:
        return
    real = cls.__enter__
    said: list[bool] = []  # the first region turned off was told

    @functools.wraps(real)
    def __enter__(self: Any) -> Any:
        if str(getattr(self, "device", "")) == device and getattr(self, "fast_dtype", None) == torch.bfloat16:
            self._enabled = False
            if not said:
                said.append(True)
                _say("autocast-off", device=device, **_rank())
        return real(self)

    cls.__enter__, cls._gpu_preflight_off = __enter__, device


def _wrap_forward(m: Any, wrap: Callable[[Any], Any]) -> None:
    m.forward = functools.wraps(m.forward)(wrap(m.forward))


def _under_autocast(torch: Any, forward: Any, device: str, dtype: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=dtype):
            return forward(*args, **kwargs)

    return run


def _channels_last_inputs(torch: Any, forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        args = tuple(
            a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a
            for a in args
        )
        return forward(*args, **kwargs)

    return run


def _timed(fn: Callable[..., Any], st: _Steps, region: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if st.stack and st.stack[-1][0] == region:  # nested in its own region (Tensor.backward's autograd.backward)
            return fn(*args, **kwargs)
        st.enter(region)
        try:
            return fn(*args, **kwargs)
        finally:
            st.leave(region)

    return wrapper


Target = Callable[[tuple[Any, ...], dict[str, Any], Any], Any]  # (args, kwargs, what it returned) -> path or file


class _Save:
    """The outermost checkpoint call in progress: what it and the writers it calls wrote."""

    def __init__(self) -> None:
        self.since = time.time_ns() - _MTIME_SLACK_NS
        self.files: set[str] = set()  # files the nested writers (torch.save, save_file) wrote
        self.roots: list[str] = []  # files or folders the outermost call wrote into

    def written(self) -> int:
        """Bytes on disk now of every file the save wrote: the writers' own files, and each file under its target
        (a file, or a folder: accelerate, DCP, the transformers Trainer) modified since the save began."""
        files = {f for f in self.files if os.path.isfile(f)}
        for root in self.roots:
            files |= _changed(root, self.since)
        total = 0
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(f)
        return total


# A file's mtime comes from the kernel's coarse clock, up to a tick (1-10 ms) behind time.time_ns(): a file the
# save wrote can read as a little older than its start.
_MTIME_SLACK_NS = 15_000_000
_WALK_LIMIT = 10_000  # files looked at under one target folder (a save into a big tree is not walked whole)


def _changed(root: str, since: int) -> set[str]:
    """The files at or under ``root`` whose mtime is ``since`` or later."""
    out: set[str] = set()
    if os.path.isfile(root):
        return {root} if os.stat(root).st_mtime_ns >= since else out
    seen = 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            seen += 1
            with contextlib.suppress(OSError):
                if os.stat(path).st_mtime_ns >= since:
                    out.add(path)
            if seen >= _WALK_LIMIT:
                return out
    return out


def _saving(fn: Callable[..., Any], st: _Steps, target: Target, read_back: bool = False) -> Callable[..., Any]:
    """Time a checkpoint writer as ``checkpoint``: the outermost call is one save (``save_state`` calling
    ``torch.save`` five times is one), its bytes what landed on disk; ``read_back``: torch.save's file, which
    verify loads after the run as a resume would."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = st.save is None
        if not outer:
            out = fn(*args, **kwargs)
            _safely(_note_file, st.save, target, args, kwargs, out)
            return out
        save = st.save = _Save()
        before = _safely(_buffer_at, target(args, kwargs, None))
        st.enter("checkpoint")
        # verify's stop (SIGINT) waits for a save to end: it never leaves the user a torn checkpoint
        with _HeldInterrupt():
            try:
                out = fn(*args, **kwargs)
            finally:
                st.leave("checkpoint")
                st.save = None
            _safely(_count_save, st, save, target(args, kwargs, out), before, read_back, out)
        return out

    return wrapper


_READ_BACK: set[str] = set()  # the files torch.save wrote, whose renames verify follows


def _following(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``os.replace``/``os.rename`` (``Path.replace``/``rename`` call them): a file torch.save wrote, renamed
    into place (the atomic-save idiom), is read back under its final name."""

    @functools.wraps(fn)
    def wrapper(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(src, dst, *args, **kwargs)
        _safely(_moved, src, dst)
        return out

    return wrapper


def _moved(src: Any, dst: Any) -> None:
    if isinstance(src, (str, os.PathLike)) and isinstance(dst, (str, os.PathLike)):
        before = os.path.abspath(os.fspath(src))
        if before in _READ_BACK:
            _READ_BACK.discard(before)
            _say("moved", path=before, to=os.path.abspath(os.fspath(dst)), **_rank())


def _note_file(save: _Save, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    where = target(args, kwargs, out)
    if isinstance(where, (str, os.PathLike)):
        save.files.add(os.path.abspath(os.fspath(where)))


def _buffer_at(where: Any) -> int | None:
    """Where a file-like target (a BytesIO Lightning writes out later, an open file) stood before the save."""
    tell = None if isinstance(where, (str, os.PathLike)) else getattr(where, "tell", None)
    return int(tell()) if tell is not None else None


def _count_save(st: _Steps, save: _Save, where: Any, before: int | None, read_back: bool, out: Any) -> None:
    counted = not st.phases  # a save inside a phase is the phase's (its time is there), not the steps'
    st.saves += counted
    if isinstance(where, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(where))
        save.roots.append(path)
        if read_back:
            _READ_BACK.add(path)
            _say("saved", path=path, **_rank())
    elif before is not None and counted:  # a buffer (Lightning's BytesIO): its bytes are what its write puts on disk
        st.ckpt_bytes += (_buffer_at(where) or before) - before
    done = getattr(out, "add_done_callback", None)
    if callable(done) and counted:  # DCP's async_save: the files land when its future completes (in that step)
        done(lambda _: _safely(_add_bytes, st, save))
    elif counted:
        st.ckpt_bytes += save.written()


def _add_bytes(st: _Steps, save: _Save) -> None:
    st.ckpt_bytes += save.written()


def _arg(index: int, name: str) -> Target:
    """The target of a writer called as ``fn(..., target, ...)``: positional ``index`` or keyword ``name``."""
    return lambda args, kwargs, out: args[index] if len(args) > index else kwargs.get(name)


class _HeldInterrupt:
    """Hold SIGINT while a checkpoint is written and deliver it after (main thread only: elsewhere Python runs no
    signal handler anyway). A script's own SIGINT handler gets it then, as it would have."""

    def __enter__(self) -> None:
        self.caught: list[int] = []
        self.held = threading.current_thread() is threading.main_thread()
        if self.held:
            self.before = signal.signal(signal.SIGINT, lambda sig, frame: self.caught.append(sig))

    def __exit__(self, *exc: object) -> None:
        if not self.held:
            return
        signal.signal(signal.SIGINT, signal.SIG_DFL if self.before is None else self.before)  # None: not Python's
        if self.caught:
            os.kill(os.getpid(), signal.SIGINT)


def _patch_next(cls: Any, st: _Steps) -> None:
    real = cls.__next__

    @functools.wraps(real)
    def __next__(self: Any) -> Any:
        key = self.__dict__.get("_gpu_preflight_key")
        if key is None:
            key = self._gpu_preflight_key = f"data:{id(getattr(self, '_dataset', self))}"
        st.enter(key)
        try:
            batch = real(self)
        finally:
            st.leave(key)
        _safely(st.fetched, key, batch, self)
        return batch

    cls.__next__ = __next__


def _loader_batch(it: Any) -> int | None:
    """The batch size a DataLoader iterator's sampler hands out (None without automatic batching, or no loader)."""
    if not getattr(it, "_auto_collation", False):
        return None
    return getattr(getattr(it, "_index_sampler", None), "batch_size", None)


def _patch_backward(torch: Any, st: _Steps) -> None:
    real_tensor = torch.Tensor.backward

    @functools.wraps(real_tensor)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        outermost = not st.stack or st.stack[-1][0] != "backward"
        st.enter("backward")
        try:
            return real_tensor(self, *args, **kwargs)
        finally:
            st.leave("backward")
            if outermost:
                st.micro += 1
                st.loss = self.detach() if self.numel() == 1 else st.loss

    torch.Tensor.backward = backward
    torch.autograd.backward = _timed(torch.autograd.backward, st, "backward")


def _patch_autocast(torch: Any, st: _Steps) -> None:
    """``torch.autocast`` (and ``torch.cuda.amp.autocast``, its subclass): the dtype of the regions entered."""
    cls = torch.amp.autocast_mode.autocast
    real = cls.__enter__

    @functools.wraps(real)
    def __enter__(self: Any) -> Any:
        out = real(self)
        dtype = _DTYPES.get(str(getattr(self, "fast_dtype", "")))
        if getattr(self, "_enabled", False) and dtype:
            st.amp[str(self.device)] = dtype
        return out

    cls.__enter__ = __enter__


def _flop_counter(torch: Any) -> Any:
    """A dispatch mode that adds up torch's FLOP formulas (``torch.utils.flop_counter.flop_registry``: matmuls,
    convolutions, attention) for every op it sees; ops without a formula are decomposed first, as torch's own
    counter does."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    metadata = {
        aten.size.default,
        aten.stride.default,
        aten.dim.default,
        aten.numel.default,
        aten.is_contiguous.default,
    }
    metadata |= {aten.storage_offset.default, aten.sym_size.default, aten.sym_stride.default, aten.sym_numel.default}

    class Count(TorchDispatchMode):
        flops = 0
        missed = 0
        ops = 0  # the ops the step dispatched (not views, not their decompositions): on a GPU, about its kernels
        inside = 0  # > 0: inside a decomposition of a counted op

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in metadata:
                return NotImplemented
            if not self.inside and not getattr(func, "is_view", False):
                self.ops += 1
            packet = getattr(func, "_overloadpacket", None)  # a higher-order op (torch.compile's) has none
            if packet is not None and packet not in flop_registry:
                self.inside += 1
                try:
                    with self:
                        out = func.decompose(*args, **kwargs)
                finally:
                    self.inside -= 1
                if out is not NotImplemented:
                    return out
            out = func(*args, **kwargs)
            if packet in flop_registry:
                try:
                    self.flops += int(flop_registry[packet](*args, **kwargs, out_val=out))
                except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: uncounted
                    self.missed += 1
            return out

    return Count()


def _on_ddp(module: Any) -> None:
    """DistributedDataParallel: time its exchange with a comm hook that does what DDP's default does (average the
    bucket with one all-reduce), installed at the model's first forward unless the script registered its own."""
    st = _STEPS
    cls = getattr(module, "DistributedDataParallel", None)
    if st is None or cls is None or getattr(cls, "_gpu_preflight_patched", False):
        return  # before torch's own hooks (_on_torch calls this again), or already done
    cls._gpu_preflight_patched = True
    real_forward, real_register = cls.forward, cls.register_comm_hook
    real_builtin = getattr(cls, "_register_builtin_comm_hook", None)

    def register_comm_hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._gpu_preflight_theirs = True
        return real_register(self, *args, **kwargs)

    def register_builtin(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._gpu_preflight_theirs = True
        return real_builtin(self, *args, **kwargs) if real_builtin is not None else None

    @functools.wraps(real_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_gpu_preflight_seen", False):
            self._gpu_preflight_seen = True
            _safely(_hook_ddp, self, st, real_register)
        return real_forward(self, *args, **kwargs)

    cls.forward = forward
    cls.register_comm_hook = register_comm_hook
    if real_builtin is not None:
        cls._register_builtin_comm_hook = register_builtin


def _hook_ddp(model: Any, st: _Steps, register: Callable[..., Any]) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = getattr(model, "process_group", None)
    _say(
        "ddp",
        backend=str(dist.get_backend(group)),
        hooked=not getattr(model, "_gpu_preflight_theirs", False),
        **_rank(),
    )
    if getattr(model, "_gpu_preflight_theirs", False):
        return  # the script's own hook stays; its exchange is not timed
    if os.environ.get(DDP_ENV) == "skip":  # the A/B's other leg: the step without the exchange (ranks drift apart)
        import torch

        def skipped(state: Any, bucket: Any) -> Any:
            done: Any = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        skipped.__annotations__ = {}
        register(model, group, skipped)
        _say("ddp-skipped", **_rank())
        return

    def timed(state: Any, bucket: Any) -> Any:
        st.comm_mark = st.mark()
        buffer = bucket.buffer()
        st.comm_bytes += buffer.numel() * buffer.element_size()
        return default_hooks.allreduce_hook(state, bucket)

    timed.__annotations__ = {}  # DDP accepts only its own annotations (dist.GradBucket) or none
    register(model, group, timed)
    st.comm_hooked = True


def _on_dcp(module: Any) -> None:
    """``torch.distributed.checkpoint.save``/``async_save``: the folder is ``checkpoint_id`` or the writer's."""
    import importlib

    saver = importlib.import_module("torch.distributed.checkpoint.state_dict_saver")

    def folder(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        where = kwargs.get("checkpoint_id") or getattr(kwargs.get("storage_writer"), "path", None)
        return os.fspath(where) if where is not None else None

    for name in ("save", "async_save"):
        for owner in (saver, module):  # re-exported: both attributes are what user code may call
            if hasattr(owner, name):
                setattr(owner, name, _saving(getattr(owner, name), _need(), folder))


def _on_safetensors(module: Any) -> None:
    """safetensors' ``save_file(tensors, filename)`` and ``save_model(model, filename)`` (which calls the first)."""
    for name in ("save_file", "save_model"):
        if hasattr(module, name):
            setattr(module, name, _saving(getattr(module, name), _need(), _arg(1, "filename")))


def _on_accelerate(module: Any) -> None:
    """``Accelerator.save_state``: one save, everything it wrote into the folder it returns."""
    cls = module.Accelerator
    cls.save_state = _saving(cls.save_state, _need(), lambda args, kwargs, out: out)


def _on_lightning_trainer(module: Any) -> None:
    """Lightning's ``Trainer.save_checkpoint(filepath)`` (what ``ModelCheckpoint`` calls): a ``torch.save`` into a
    BytesIO, then an fsspec write of the file, both inside it."""
    cls = module.Trainer
    cls.save_checkpoint = _saving(cls.save_checkpoint, _need(), _arg(1, "filepath"))


def _on_lightning_io(module: Any) -> None:
    """Lightning's ``TorchCheckpointIO.save_checkpoint(checkpoint, path)``: Fabric's ``save`` goes through it."""
    cls = module.TorchCheckpointIO
    cls.save_checkpoint = _saving(cls.save_checkpoint, _need(), _arg(2, "path"))


def _on_transformers_trainer(module: Any) -> None:
    """The transformers ``Trainer``: ``_save_checkpoint`` (its periodic save, a ``checkpoint-N`` folder under
    ``args.output_dir``) and ``save_model``; the files it modified under the output folder."""
    cls = module.Trainer

    def output(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        given = args[1] if len(args) > 1 and isinstance(args[1], (str, os.PathLike)) else kwargs.get("output_dir")
        return given or getattr(getattr(args[0], "args", None), "output_dir", None)

    for name in ("_save_checkpoint", "save_model"):
        if hasattr(cls, name):
            setattr(cls, name, _saving(getattr(cls, name), _need(), output))


def _need() -> _Steps:
    if _STEPS is None:  # every writer's module imports torch first, so torch's hooks are in by now
        raise RuntimeError("checkpoint writer imported before torch's hooks")
    return _STEPS


def _overrides() -> dict[str, Any]:
    text = os.environ.get(LOADER_ENV, "")
    return json.loads(text) if text else {}


def _patch_loader_init(cls: Any) -> None:
    import inspect

    real = cls.__init__
    signature = inspect.signature(real)
    wanted = _overrides()

    @functools.wraps(real)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        asked = {k: bound.arguments.get(k) for k in ("num_workers", "pin_memory", "persistent_workers")}
        asked["prefetch_factor"] = bound.arguments.get("prefetch_factor")
        asked["batch_size"] = bound.arguments.get("batch_size")
        site = _call_site()
        if wanted:
            bound.arguments.update(_valid(wanted, bound.arguments))
            args, kwargs = bound.args[1:], bound.kwargs
        real(self, *args, **kwargs)
        _safely(_loader_event, self, asked, site)

    cls.__init__ = __init__


def _valid(wanted: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The overrides that the loader accepts (prefetch_factor and persistent_workers need workers; a batch size
    only where the loader batches by it: not with a batch_sampler, nor with batch_size=None)."""
    out = dict(wanted)
    if current.get("batch_sampler") is not None or current.get("batch_size") is None:
        out.pop("batch_size", None)
    if int(out.get("num_workers", current.get("num_workers") or 0)) == 0:
        out["prefetch_factor"], out["persistent_workers"] = None, False
    return out


def _call_site() -> str:
    """``file:line`` of the user's code that built the loader (outside torch and this file)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in name and not name.endswith("_gpu_preflight_agent.py"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _length(dataset: Any) -> int | None:
    """A map-style dataset's samples (the epoch verify prices); None for one without ``len`` (an iterable)."""
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - no len, or a len that raises: the epoch is unknown, not an error
        return None


def _loader_event(loader: Any, asked: dict[str, Any], site: str) -> None:
    got = {k: getattr(loader, k, None) for k in ("num_workers", "pin_memory", "persistent_workers")}
    got["prefetch_factor"] = getattr(loader, "prefetch_factor", None)
    _say(
        "loader",
        feed=f"data:{id(loader.dataset)}",
        dataset=type(loader.dataset).__name__,
        samples=_length(loader.dataset),
        batch_size=getattr(loader, "batch_size", None),
        settings=got,
        asked=asked,
        site=site,
        **_rank(),
    )
