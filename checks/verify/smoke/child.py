"""The smoke test's child process: build the run from its spec, go through the phases, write one JSON result.

Phases: setup -> FLOP count -> warm-up -> measure -> kernel profile (GPU) -> memory -> checkpoint round trip ->
compile A/B (asked) -> batch sweep (asked) -> the loader alone (when the loop waited for data). Each phase adds to
the result as it finishes, so Ctrl-C (SIGINT from the parent) or an error still leaves a partial result with
everything measured so far. Progress goes to the events file as JSON lines; the result file is written once,
atomically, at the end.

With ``spec.stop`` (one process) the measured steps end by the stop rule of ``checks/verify/stop.py`` (stable
shares, the whole command's budget, the cap), and the extras after them run on what the budget leaves; what it
cut is in ``cuts``. Without it (several processes, which must stop together), exactly ``spec.steps`` steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
import traceback
import typing
from pathlib import Path
from typing import Any

import torch

from checks.verify import stop as rule
from checks.verify.contract import (
    ChildResult,
    ContractError,
    DeviceEvent,
    EstimateEvent,
    Event,
    LoaderProbeSpec,
    OomProbeEvent,
    PhaseEvent,
    RunSpec,
    Step,
    StepEvent,
    StopFacts,
    StopSpec,
    SweepEvent,
    event_line,
)
from checks.verify.figures import breakdown, largest_fit
from checks.verify.smoke import candidates, ddp, extras, resume
from checks.verify.smoke.budget import Budget
from checks.verify.smoke.data import StagedDataError
from checks.verify.smoke.loop import Feed, Interrupted, Pending, Trainer, finished, resolve, run_steps, train
from checks.verify.smoke.setup import Build, UsageError, build

MIN_MEASURED_UNDER_PRESSURE = rule.MIN_UNDER_PRESSURE


class Events:
    """Append-only event lines the parent tails (progress, and the device as soon as it is known)."""

    def __init__(self, path: str) -> None:
        self.fh = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives as long as the process

    def __call__(self, event: Event) -> None:
        self.fh.write(event_line(dataclasses.replace(event, t=time.monotonic())) + "\n")


class Smoke:
    """One run of the phases; ``result`` grows as they finish."""

    def __init__(self, spec: RunSpec, emit: Events) -> None:
        self.spec, self.emit = spec, emit
        self.result: dict[str, Any] = {"interrupted": False, "error": None, "timeline": {}, "warmup": [], "steps": []}
        self.b: Build | None = None
        self.budget = Budget(spec, self.result)

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.result["phase"] = name
        self.result["timeline"][name] = [now, now]
        self.emit(PhaseEvent(name))

    def done(self, name: str) -> None:
        self.result["timeline"][name][1] = time.monotonic()

    def run(self) -> None:
        self.phase("setup")
        self.b = b = build(self.spec)
        self.result.update(b.describe())
        self.emit(DeviceEvent(**self.result["device"]))
        self.done("setup")
        if b.cuda:  # the count is only for MFU, which needs a GPU's datasheet peak (about a second on 2 cores)
            self.phase("flops")
            # A separate dataset object: touching the loader's own in this process would open its memory maps
            # here, and a spawn/forkserver worker started later would receive the whole array instead of a path.
            source = b.fresh_dataset()
            batch = torch.utils.data.default_collate([source[i] for i in range(b.batch_size)])
            flops, note = extras.count_flops(b.trainer, batch)
            self.result.update(flops_per_step=flops, flops_note=note)
            self.done("flops")
        else:
            self.result.update(flops_per_step=None, flops_note="not counted off the GPU (MFU needs a GPU's peak)")
        if self.spec.ddp:
            b.wrap = lambda m: ddp.wrap(m, b.device)
            b.trainer.model = b.wrap(b.trainer.model)
        if not self.train():
            return
        if b.cuda:
            self.timed("kernels", lambda: extras.kernel_stats(b.trainer, b.feed, self.spec.profile_steps))
        self.result["memory"] = extras.memory(b.cuda)
        if self.spec.checkpoint:
            self.timed("checkpoint", self.round_trip)
        if self.spec.ddp:
            self.distributed()
        ab = self.spec.ab
        if ab and self.budget.fits("ab", (3 + ab.steps) * self.pace() + rule.COMPILE_S, "the torch.compile A/B (--ab)"):
            self.timed("ab", lambda: extras.compile_ab(b.trainer, b.feed, ab.steps))
        if self.spec.sweep:
            self.timed("sweep", self.sweep)
        probe = self.spec.loader_probe
        steps = [Step.from_json(s) for s in self.result["steps"]]
        if probe and steps and breakdown(steps)["data_wait"] >= probe.min_share:
            seconds = self.budget.probe_seconds(probe.seconds)
            if seconds > 0:
                self.timed("loader_alone", lambda: self.loader_alone(probe, seconds))
                self.timed("data_cost", lambda: candidates.data_cost(self.local(), seconds * candidates.COST_SHARE))

    def pace(self) -> float:
        """A step's seconds: the median measured step, else the warm-up's after its first."""
        measured = [Step.from_json(s).total for s in self.result.get("steps") or []]
        warm = [Step.from_json(s).total for s in self.result.get("warmup") or []]
        found = measured or warm[1:] or warm
        return statistics.median(found) if found else 0.0

    def distributed(self) -> None:
        """The no_sync A/B, then the one-process leg (last: rank 0's model leaves the others' there)."""
        b, d = self.b, self.spec.ddp
        assert b is not None and d is not None
        self.result["ddp"] = {"rank": d.rank, "world_size": d.world_size, "backend": d.backend}
        self.phase("comm")
        self.result["ddp"]["comm_ab"] = ddp.comm_ab(b.trainer, b.feed, d.windows, d.window_steps)
        self.done("comm")
        self.phase("solo")
        self.result["ddp"]["solo"] = ddp.solo(b.trainer, b.feed, d.solo_steps)
        self.done("solo")

    def loader_alone(self, probe: LoaderProbeSpec, seconds: float) -> dict[str, Any]:
        """Last, as it opens the data in this process: the loader's own rate at each candidate setting, within
        ``seconds`` (verify.loader_probe_s, or what the budget left of it)."""
        b = self.b
        assert b is not None
        b.feed.close()  # its persistent workers would compete with the ones timed here

        def make(dataset: Any, loader: dict[str, Any]) -> Feed:
            return Feed(dataset, b.batch_size, self.spec.seed, loader)

        cores = probe.cores or len(os.sched_getaffinity(0))
        deadline = self.budget.deadline()
        found = candidates.loader_alone(
            make, b.dataset, self.local(), b.loader, seconds * (1 - candidates.COST_SHARE), cores, b.cuda, deadline
        )
        if found.get("not_timed"):
            short = len(found["not_timed"]) * float(found["seconds_each"]) + rule.PROBE_START_S
            timed = f"{len(found['candidates'])} of {len(found['candidates']) + len(found['not_timed'])}"
            self.budget.cut("loader_alone", f"the DataLoader alone timed at {timed} worker counts", short)
        return found

    def local(self) -> Any:
        """A dataset this process may open (the built-in ones afresh; a user's own is the loop's)."""
        b = self.b
        assert b is not None
        return b.fresh_dataset() if not self.spec.dataset else b.dataset

    def timed(self, name: str, work: Any) -> None:
        """Run an optional phase; its failure (a full disk, a profiler without CUPTI) is its result, not the run's."""
        self.phase(name)
        try:
            self.result[name] = work()
        except Exception as exc:  # noqa: BLE001 - reported in the phase's own result
            self.result[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
            traceback.print_exc()
        self.done(name)

    def train(self) -> bool:
        """Warm up and measure; on OOM record the memory figures and the largest batch that fits."""
        b = self.b
        assert b is not None
        try:
            self.warm_up()
            if self.spec.stop is None:
                self.steps("steps", self.spec.steps, phase="measure")
            else:
                self.measure(self.spec.stop)
        except Exception as exc:
            if not extras.oom_error(exc):
                raise
            if self.spec.ddp:  # a search would run steps on this rank alone and hang the others
                raise
            self.result["oom"] = self.out_of_memory(exc)
            return False
        return True

    def warm_up(self) -> None:
        """``spec.warmup`` steps; under a budget (not with --steps N) the warm-up ends after ``rule.MIN_WARMUP``
        steps once it has used ``rule.WARMUP_SHARE`` of the time left when it began, a cut the report names."""
        stop, asked, left = self.spec.stop, self.spec.warmup, self.budget.left()
        if stop is None or stop.forced or left == math.inf or asked <= rule.MIN_WARMUP:
            self.steps("warmup", asked)
            return
        began, share = time.monotonic(), left * rule.WARMUP_SHARE

        def why(n: int, pending: list[Pending]) -> str | None:
            return "budget" if n >= rule.MIN_WARMUP and time.monotonic() - began > share else None

        if self.loop("warmup", "warmup", asked, why) and len(self.result["warmup"]) < asked:
            done, spent = len(self.result["warmup"]), time.monotonic() - began
            pace = spent / max(done, 1)
            self.budget.cut("warmup", f"warm-up ended after {done} of {asked} steps ({pace:.2f} s a step)",
                            (asked - done) * pace)  # fmt: skip

    def measure(self, stop: StopSpec) -> None:
        """Measure until the shares are stable, the cap, or the budget (``checks/verify/stop.py``)."""
        warm = [Step.from_json(x) for x in self.result.get("warmup") or []]
        step_s = self.pace()
        data = sum(x.data_wait for x in warm[1:] or warm) / max(sum(x.total for x in warm[1:] or warm), 1e-9)
        rest = self.budget.reserve(step_s, data, self.b is not None and self.b.cuda)
        window = min(self.budget.left() - rest, stop.measure_s or math.inf)
        asked = self.spec.steps
        least, most = (asked, asked) if stop.forced else rule.counts(asked, stop.min_steps, step_s, window)
        left = self.budget.left()
        self.emit(
            EstimateEvent(round(step_s, 4), least, most, round(rest, 1), round(left, 1) if left < math.inf else 0)
        )
        began = time.monotonic()
        end_by = began + window

        def why(n: int, pending: list[Pending]) -> str | None:
            if stop.forced or n >= most:
                return None
            b = self.b
            assert b is not None
            if n >= least and rule.stable(rule.rows_of(finished(b.trainer.clock, pending)), least, stop.width,
                                          stop.batches):  # fmt: skip
                return "stable"
            now = time.monotonic()  # the pace so far, not the warm-up's: a neighbour may have slowed the steps
            return (
                "budget" if n >= MIN_MEASURED_UNDER_PRESSURE and now + max(step_s, (now - began) / n) > end_by else None
            )

        reason = self.loop("steps", "measure", most, why)
        measured = [Step.from_json(x) for x in self.result["steps"]]
        if reason is None:
            reason = "forced" if stop.forced else "budget" if most < asked else "steps"
        facts = StopFacts(
            reason, len(measured), least, most, asked, stop.width,
            rule.half_widths(rule.rows_of(measured), stop.batches), round(step_s, 4),
            round(most * step_s + rest, 1),
        )  # fmt: skip
        self.result["stop"] = facts.to_json()
        cut = rule.measure_cut(facts, stop.budget_s)
        if cut is not None:
            self.result.setdefault("cuts", []).append(cut.to_json())

    def loop(self, key: str, phase: str, most: int, why: Any) -> str | None:
        """Up to ``most`` steps, asking ``why(n, pending)`` after each whether to stop (its reason ends them)."""
        b = self.b
        assert b is not None
        self.phase(phase)
        prev, pending, reason = b.trainer.clock.mark(), list[Pending](), None
        try:
            for i in range(most):
                pending += run_steps(b.trainer, b.feed, 1, pending[-1].end if pending else prev, lambda _: None)
                self.emit(StepEvent(phase, i + 1, most))
                reason = why(i + 1, pending)
                if reason:
                    break
        except Interrupted as stop:
            pending += stop.pending
            self.result[key] = [r.as_dict() for r in resolve(b.trainer.clock, pending)]
            self.done(phase)
            raise
        self.result[key] = [r.as_dict() for r in resolve(b.trainer.clock, pending)]
        self.done(phase)
        return typing.cast(str | None, reason)

    def steps(self, key: str, count: int, phase: str | None = None) -> None:
        b = self.b
        assert b is not None
        self.phase(phase or key)
        prev = b.trainer.clock.mark()
        try:
            pending = run_steps(
                b.trainer, b.feed, count, prev, lambda i: self.emit(StepEvent(phase or key, i + 1, count))
            )
        except Interrupted as stop:
            self.result[key] = [r.as_dict() for r in resolve(b.trainer.clock, stop.pending)]
            self.done(phase or key)
            raise
        self.result[key] = [r.as_dict() for r in resolve(b.trainer.clock, pending)]
        self.done(phase or key)

    def out_of_memory(self, exc: BaseException) -> dict[str, Any]:
        b = self.b
        assert b is not None
        b.feed.close()
        extras.release(b.cuda)
        figures = extras.memory(b.cuda)
        self.phase("oom-search")

        def fits(batch: int) -> bool:
            self.emit(OomProbeEvent(batch))
            try:
                feed = b.feed_factory(batch)
                train(b.trainer, feed, 2)
                feed.close()
                return True
            except Exception as err:
                if not extras.oom_error(err):
                    raise
                extras.release(b.cuda)
                return False

        largest = largest_fit(fits, b.batch_size)
        self.done("oom-search")
        return {
            "batch": b.batch_size,
            "message": str(exc).splitlines()[0][:300],
            "memory": figures,
            "largest_fit": largest,
        }

    def round_trip(self) -> dict[str, Any]:
        b, spec = self.b, self.spec.checkpoint
        assert b is not None and spec is not None
        return resume.round_trip(b, spec, self.spec.ddp, self.result)

    def sweep(self) -> dict[str, Any]:
        b, s = self.b, self.spec.sweep
        assert b is not None and s is not None
        b.feed.close()

        def make(batch: int) -> tuple[Trainer, Feed]:
            self.emit(SweepEvent(batch))
            return b.trainer, b.feed_factory(batch)

        deadline = self.budget.deadline()
        found = extras.sweep(make, b.batch_size, s.limit, s.warmup, s.steps, s.knee, deadline)
        if found.get("cut_at"):
            short = float(found.get("cut_needs_s") or 0.0)
            self.budget.cut("sweep", f"the batch sweep stopped before batch {found['cut_at']}", short)
        return found


def typed(result: dict[str, Any]) -> dict[str, Any]:
    """The result as the contract writes it (``ChildResult``: its keys, its types): a key or value the contract does
    not know is caught here, in the producer, and reported as the run's error with what was measured before it."""
    try:
        return ChildResult.from_json(json.loads(json.dumps(result, default=str))).to_json()
    except ContractError as exc:
        kept = {k: result[k] for k in ("interrupted", "timeline", "phase") if k in result}
        return ChildResult.from_json(json.loads(json.dumps(kept))).to_json() | {
            "error": f"the child's result breaks the contract: {exc}",
            "error_kind": "crash",
        }


def main(argv: list[str]) -> int:
    spec = RunSpec.from_json(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
    smoke = Smoke(spec, Events(spec.events))
    try:
        if spec.ddp:
            smoke.phase("init")
            ddp.start(spec.ddp)
            smoke.done("init")
        smoke.run()
    except KeyboardInterrupt:
        smoke.result["interrupted"] = True
    except (UsageError, StagedDataError) as exc:
        smoke.result.update(error=str(exc), error_kind="usage", error_hint=getattr(exc, "hint", "") or None)
    except Exception as exc:  # noqa: BLE001 - the parent reports it; the partial result still counts
        where = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:400] if str(exc) else ''}"
        smoke.result.update(error=f"{text} ({Path(where.filename).name}:{where.lineno})", error_kind="crash")
        traceback.print_exc()
    if spec.ddp and smoke.result["error"] is None and not smoke.result["interrupted"]:
        ddp.stop()  # after a failure a peer may be gone: the process exits without the collective teardown
    out = Path(spec.result)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(typed(smoke.result)), encoding="utf-8")
    tmp.replace(out)
    sys.stdout.flush()
    return 0
