"""Representative verify runs, judged by the command's judge without a process: what the JSON report of each must
hold.

Every case is a ``CommandRun`` (the agent's events, how it ended) and what verify gathered beside it (the
sampler's trace, the GPU's index, the gate's rows, the usable cores, the price), judged by
``checks.verify.user.judge.judge``:

- the six hand-made GPU traces (``tests/fixtures/traces``) and two runs recorded on a CPU box by the built-in
  loop's child (``runs/cpu-*.json``: one process, data-bound, with a checkpoint and a price; two gloo ranks),
  each a child's ``ChildResult`` turned into the agent's lines by ``recorded.py``, with its trace;
- the ends a run can come to without figures: out of memory at the asked batch (and the largest batch that fits,
  ``OomSearch``), a crash before any step, a run whose steps stopped coming, Ctrl-C;
- five ``verify -- COMMAND`` runs recorded as they are (``runs/command-*.json``: data-bound, a save every step,
  accumulation over dict batches, a crash at step 3, two torchrun ranks over gloo).

``golden/<case>.json`` is what the code wrote for each case (the compatibility check of
``test_report_json.py``); ``python -m tests.checks.verify.verify_cases`` rewrites them after a deliberate change of
the report.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checks.config import make_config
from checks.reports.verify import CommFigures, Files, Measurements, Oom
from checks.result import Result, ok, warn
from checks.verify.contract import ChildResult, CommAb
from checks.verify.diagnosis import Verdict
from checks.verify.report import Setting
from checks.verify.sampler import Trace, read_csv
from checks.verify.user import exchange
from checks.verify.user import sweep as sweeper
from checks.verify.user.judge import OomSearch, judge, oom_memory, pace_setter, ranks
from checks.verify.user.launch import CommandRun
from checks.verify.user.run import epoch_samples
from tests.checks.verify.recorded import Recorded, parsed, recorded

HERE = Path(__file__).resolve().parent
TRACES = HERE.parents[1] / "fixtures" / "traces"
RUNS, GOLDEN = HERE / "runs", HERE / "golden"
CFG = make_config().verify
FILES = Files("reports/r.json", "reports/r.samples.csv", "reports/r.png")
EVERY = 500  # the tool's own script saves every this many steps in the real run (its --ckpt-every)
NO_NVML = "no GPU columns: NVML is not here"
TRACE_NAMES = sorted(p.stem for p in TRACES.glob("*.json"))

# The built-in loop's spec of the recorded CPU run (test_launch.py's, which goes with the built-in loop)


@dataclasses.dataclass(frozen=True)
class Case:
    """What ``judge`` gets for one run: the command run, the stop rule's warm-up and steps, the sampler's trace,
    the GPU the run used (or why none), the setting, the gate's rows, and the re-runs' figures (``sweep``,
    ``oom``, ``exchange``) or ``hosts``."""

    run: CommandRun
    warmup: int
    steps: int
    trace: Trace
    setting: Setting
    gpu: int | None = 0
    gpu_error: str | None = None
    gate: list[Result] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def judged(self) -> tuple[list[Result], Measurements, list[Verdict]]:
        return judge(self.run, self.trace, self.setting, CFG, self.warmup, self.steps, 0.0, self.gate, self.gpu,
                     self.gpu_error, **self.extra)  # fmt: skip


def setting(cores: float = 16.0, price: float = 0.0, every: int = EVERY, epoch: int | None = None) -> Setting:
    """The ``Setting`` verify builds for its own script: the usable cores, relative output paths (a report holds
    them as given), the price, the real run's save interval, a staged epoch's samples."""
    return Setting(cores, FILES, price, ckpt_every=every, epoch_samples=epoch, own_code=True)


def _result(name: str) -> dict[str, Any]:
    return dict(json.loads((TRACES / f"{name}.json").read_text(encoding="utf-8"))["result"])


def _case(rec: Recorded, trace: Trace, s: Setting, gpu: int | None = 0, gpu_error: str | None = None,
          **extra: Any) -> Case:  # fmt: skip
    return Case(rec.run, rec.warmup, rec.steps, trace, s, gpu, gpu_error, extra=extra)


def trace_case(name: str, **kw: Any) -> Case:
    """A GPU trace (``tests/fixtures/traces/<name>``): the child's steps as the agent's lines, its NVML trace for
    GPU 0; ``kw``: the ``setting``'s price or staged epoch."""
    rec = recorded(ChildResult.from_json(_result(name)))
    return _case(rec, read_csv(TRACES / f"{name}.csv"), setting(**kw))


def _cpu(name: str) -> tuple[ChildResult, Trace]:
    doc = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    return ChildResult.from_json(doc["result"]), read_csv(RUNS / f"{name}.csv")


def _cpu_data_bound() -> Case:
    """The user's dataset (100,000 samples) on a CPU box: its epoch priced, a save every 5 steps in the real run."""
    result, trace = _cpu("cpu-data-bound")
    rec = recorded(result, seconds=12.5)
    epoch = epoch_samples(None, ranks(rec.run.events, rec.warmup, rec.steps, 0.0))  # the dataset's len, as verify
    return _case(rec, trace, setting(2.0, 1.2, 5, epoch), None, NO_NVML)


def _oom() -> Case:
    """Out of memory at the asked batch before any step (the agent's memory line at exit: the card full, one
    out-of-memory error counted); re-runs found the largest that fits."""
    base = _result("a100-near-oom")
    result = ChildResult.from_json({k: base[k] for k in ("device", "torch", "precision", "batch_size", "loader")})
    full = base["memory"] | {"peak_reserved_bytes": 84_557_168_640, "num_ooms": 1}  # 78.75 of 80 GiB, hand-made
    result = dataclasses.replace(result, warmup=(), steps=(), memory=full)
    error = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    stderr = ["Traceback (most recent call last):", '  File "train.py", line 52, in <module>', error]
    rec = recorded(result, ended="crashed", returncode=1, seconds=9.0, stderr=stderr, asked_steps=30)
    memory = oom_memory(rec.run.events)  # as checks/verify/user/sweep.py's largest reads the run that ran out
    search = OomSearch(Oom(batch=512, message=error, largest_fit=192, memory=memory), "train.py:40", 5)
    return _case(rec, read_csv(TRACES / "a100-near-oom.csv"), setting(), oom=search)


def _crashed() -> Case:
    """A crash before the first step (torch imported, no device yet)."""
    stderr = ["Traceback (most recent call last):", '  File "model.py", line 3, in <module>', "RuntimeError: boom"]
    rec = recorded(ChildResult(torch="2.8.0+cu128"), ended="crashed", returncode=1, seconds=2.0, stderr=stderr,
                   asked_steps=30)  # fmt: skip
    return _case(rec, read_csv(TRACES / "l4-h2d-bound.csv"), setting(), None, "no GPU")


def _killed() -> Case:
    """Steps stopped coming during the warm-up (step 3 of 5): verify stopped it, SIGINT to SIGKILL."""
    result = ChildResult.from_json(_result("l4-h2d-bound"))
    result = dataclasses.replace(result, warmup=result.steps[:3], steps=(), checkpoint=None)
    rec = recorded(result, ended="stalled", returncode=-9, seconds=61.0, asked_steps=30)
    rec = dataclasses.replace(rec, warmup=5)
    return _case(rec, read_csv(TRACES / "l4-h2d-bound.csv"), setting(), None, "no GPU")


def _interrupted() -> Case:
    """Ctrl-C after 6 of the 30 steps asked."""
    result = ChildResult.from_json(_result("rtx4090-throttled"))
    result = dataclasses.replace(result, steps=result.steps[:6])
    rec = recorded(result, ended="interrupted", returncode=-2, asked_steps=30)
    return _case(rec, read_csv(TRACES / "rtx4090-throttled.csv"), setting())


def _tokens() -> Case:
    """A token model (tokens/s), priced, with --sweep to an out-of-memory doubling."""
    rec = recorded(ChildResult.from_json(_result("h100-launch-bound")), tokens_per_sample=512)
    lead = pace_setter(ranks(rec.run.events, rec.warmup, rec.steps, 0.0), CFG)
    first = sweeper.start(lead)
    assert isinstance(first, sweeper.Start), first
    row = {"batch": first.batch, "median_step_s": round(first.median_step_s, 6), "samples_per_s": first.samples_per_s}
    rows = [row | {"peak_reserved_bytes": None}, {"batch": 2 * first.batch, "oom": True}]
    swept = {"rows": rows, "knee_batch": first.batch, "site": first.site, "re_runs": 1}
    return _case(rec, read_csv(TRACES / "h100-launch-bound.csv"), setting(price=4.0), sweep=swept)


def _exchange(ab: CommAb | None) -> CommFigures | None:
    """Rank 0's no_sync A/B as the command's exchange A/B (``checks/verify/user/exchange.py``): each window of
    steps one re-run of its leg, its mean step that run's figure."""
    if ab is None or not ab.sync_s or not ab.no_sync_s or not ab.window_steps:
        return None
    n = ab.window_steps
    legs = {leg: [statistics.fmean(xs[k : k + n]) for k in range(0, len(xs), n)]
            for leg, xs in (("sync", ab.sync_s), ("skip", ab.no_sync_s))}  # fmt: skip
    return exchange.figures(legs, CFG.exchange_ab_tolerance)


def _ddp() -> Case:
    """Two gloo ranks on this box, the exchange timed by A/B re-runs, the gate's rows."""
    result, trace = _cpu("cpu-ddp-gloo")
    argv = ("torchrun", "--nproc-per-node", "2", "train.py")
    gate = [ok("driver", "no driver: a CPU box"), warn("cpu-cores", "2 usable cores", "rent more cores")]
    exchange = _exchange(result.ddp.comm_ab if result.ddp else None)
    case = _case(recorded(result, argv, seconds=12.5), trace, setting(2.0), None, NO_NVML, exchange=exchange)
    return dataclasses.replace(case, gate=gate)


def _ddp_hosts() -> Case:
    """The gloo run across two hosts (--hosts): every rank's host; no re-runs (no exchange A/B), no sampler."""
    result, _ = _cpu("cpu-ddp-gloo")
    hosts = [{"host": "a", "address": "10.0.0.1", "ranks": [0]}, {"host": "b", "address": "10.0.0.2", "ranks": [1]}]
    rec = recorded(result, ("torchrun", "--nnodes", "2", "train.py"), seconds=30.0)
    return _case(rec, Trace(), setting(2.0), None, "not run with --hosts", hosts=hosts)


def _command(name: str) -> Callable[[], Case]:
    """A ``verify -- COMMAND`` run recorded on a CPU box (``runs/command-*.json``: the launcher's ``CommandRun``,
    every agent event in it, and the stop rule's warm-up and steps)."""

    def make() -> Case:
        doc = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
        raw = doc["run"]
        kept = {k: v for k, v in raw.items() if k not in ("pids", "events")}
        run = CommandRun(**kept, events=[parsed(e) for e in raw["events"]], pids=set(range(raw["pids"])))
        return Case(run, doc["warmup"], doc["steps"], Trace(), Setting(2.0, FILES, own_code=True), None, None)

    return make


COMMANDS = sorted(p.stem for p in RUNS.glob("command-*.json"))
CASES: dict[str, Callable[[], Case]] = {
    **{name: functools.partial(trace_case, name) for name in TRACE_NAMES},
    "a100-fragmented-priced": functools.partial(trace_case, "a100-fragmented", price=2.5),
    "l4-staged-priced": functools.partial(trace_case, "l4-h2d-bound", price=0.8, epoch=120_000),
    "cpu-data-bound": _cpu_data_bound,
    "cpu-ddp-gloo": _ddp,
    "cpu-ddp-hosts": _ddp_hosts,
    "tokens-sweep-priced": _tokens,
    "oom": _oom,
    "crashed": _crashed,
    "killed": _killed,
    "interrupted": _interrupted,
    **{name: _command(name) for name in COMMANDS},
}
ALL = list(CASES)


def judged(name: str) -> dict[str, Any]:
    """The case's results, measurements and verdicts as the JSON report writes them."""
    results, m, verdicts = CASES[name]().judged()
    doc = {"results": [r.to_json() for r in results], "measurements": m.to_json()}
    doc |= {"verdicts": [v.as_dict() for v in verdicts]}
    return dict(json.loads(json.dumps(doc, default=str)))


# Objects whose keys are open by design: a verdict's evidence (its own per rule), the phases of the timeline.
OPEN: dict[str, dict[str, Any]] = {
    "verdicts[].evidence": {"type": "object"},
    "timeline": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
    "results[].value": {},
}


def draft_schema(docs: list[Any], path: str = "") -> dict[str, Any]:
    """A schema that every one of ``docs`` meets: an object's keys present in all of them are required, no other
    key than those seen is allowed; a list's items meet the schema of all items seen. A starting point, edited by
    hand (``OPEN``); ``verify_report.schema.json`` is the one kept."""
    key = path.rsplit(".", 1)[-1] if "." in path else path
    for suffix, schema in OPEN.items():
        if path.endswith(suffix) or key == suffix:
            return dict(schema)
    kinds = sorted({_kind(d) for d in docs})
    out: dict[str, Any] = {"type": kinds[0] if len(kinds) == 1 else kinds}
    objects = [d for d in docs if isinstance(d, dict)]
    if objects:
        keys = sorted({k for d in objects for k in d})
        out["properties"] = {k: draft_schema([d[k] for d in objects if k in d], f"{path}.{k}") for k in keys}
        out["required"] = [k for k in keys if all(k in d for d in objects)]
        out["additionalProperties"] = False
    items = [x for d in docs if isinstance(d, list) for x in d]
    if items:
        out["items"] = draft_schema(items, f"{path}[]")
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"  # Python writes 2.0 and 2 alike as a JSON number: one kind
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(value)]


def main() -> int:
    GOLDEN.mkdir(exist_ok=True)
    docs = []
    for name in ALL:
        doc = judged(name)
        (GOLDEN / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        docs.append({k: doc[k] for k in ("results", "measurements")})
    if "--schema" in sys.argv:
        (HERE / "verify_report.schema.json").write_text(json.dumps(draft_schema(docs), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
