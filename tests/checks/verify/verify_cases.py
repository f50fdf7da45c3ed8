"""Representative verify runs, judged without a child process: what the JSON report of each must hold.

Each case is a plan and an outcome as verify's parent holds them after the child ended: the six hand-made GPU
traces (``tests/fixtures/traces``), two runs recorded on a CPU box with today's child (``runs/``: one process,
data-bound, with a checkpoint, the loader probe and a price; two gloo ranks), and the ends a run can come to
without figures (out of memory, a crash before any step, a child killed without a result, Ctrl-C).

Five ``verify -- COMMAND`` runs recorded the same way (``runs/command-*.json``: data-bound, a save every step,
accumulation over dict batches, a crash at step 3, two torchrun ranks over gloo) are judged by the command's
judge into the same report, held to the same golden files and the one schema.

``golden/<case>.json`` is what the code wrote for each case when the typed contract replaced the dicts (the
compatibility check of ``test_report_json.py``); ``python -m tests.checks.verify.verify_cases`` rewrites them
after a deliberate change of the report.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checks.config import make_config
from checks.reports.verify import Files
from checks.result import Result, ok, warn
from checks.verify.contract import ChildResult, ChildRun, DataSpec, RunSpec
from checks.verify.plan import Outcome, Plan
from checks.verify.report import Setting, judge
from checks.verify.sampler import Trace, read_csv
from checks.verify.staged import synthetic_spec
from checks.verify.user.judge import judge as command_judge
from checks.verify.user.launch import CommandRun

HERE = Path(__file__).resolve().parent
TRACES = HERE.parents[1] / "fixtures" / "traces"
RUNS, GOLDEN = HERE / "runs", HERE / "golden"
CFG = make_config().verify
LOADER = {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}


SPEC = RunSpec.from_json(json.loads((RUNS / "cpu-data-bound.json").read_text(encoding="utf-8"))["spec"])


def plan(data: DataSpec | None = None, price: float = 0.0, every: int = 500, cores: float = 16.0) -> Plan:
    """A plan with relative output paths (a report holds them as given)."""
    return Plan(
        spec=SPEC,
        data=data if data is not None else synthetic_spec("images", 64, 10, 256),
        loader=dict(LOADER),
        usable_cores=cores,
        json_path="reports/r.json",
        csv_path=Path("reports/r.samples.csv"),
        png_path=Path("reports/r.png"),
        ckpt_every=every,
        ckpt_temporary=False,
        price_per_hour=price,
    )


def _trace(name: str, result: dict[str, Any] | None, p: Plan, gpu: int | None = 0, **run: Any) -> Case:
    trace = read_csv(TRACES / f"{name}.csv")
    child = ChildRun(result=None if result is None else ChildResult.from_json(result), **run)
    return p, Outcome(child, trace, gpu, None if gpu is not None else "no GPU"), None


def _recorded(name: str, p: Plan, gate: list[Result] | None = None) -> Case:
    doc = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    child = ChildRun(result=ChildResult.from_json(doc["result"]), seconds=12.5)
    return p, Outcome(child, read_csv(RUNS / f"{name}.csv"), None, "no GPU columns: NVML is not here"), gate


Case = tuple[Plan, Outcome, "list[Result] | None"]


def _gpu(name: str, **kw: Any) -> Callable[[], Case]:
    def make() -> Case:
        doc = json.loads((TRACES / f"{name}.json").read_text(encoding="utf-8"))
        return _trace(name, doc["result"], plan(**kw))

    return make


def _oom() -> Case:
    base = json.loads((TRACES / "a100-near-oom.json").read_text(encoding="utf-8"))["result"]
    result = {k: base[k] for k in ("device", "torch", "precision", "batch_size", "accum", "loader", "model", "data")}
    memory = {"total_bytes": 85899345920, "peak_reserved_bytes": 84000000000}
    result |= {"interrupted": False, "error": None, "timeline": {}, "warmup": [], "steps": [], "phase": "oom-search"}
    result["oom"] = {"batch": 512, "message": "CUDA out of memory.", "memory": memory, "largest_fit": 192}
    return _trace("a100-near-oom", result, plan())


def _crashed() -> Case:
    result = {"interrupted": False, "error": "RuntimeError: boom (model.py:3)", "error_kind": "crash"}
    result |= {"timeline": {"setup": [1.0, 2.0]}, "warmup": [], "steps": [], "phase": "setup"}
    return _trace("l4-h2d-bound", result, plan(), None, failure=None, log_tail="Traceback\nRuntimeError: boom")


def _killed() -> Case:
    return _trace("l4-h2d-bound", None, plan(), None, failure="stalled", log_tail="step 3", seconds=61.0)


def _interrupted() -> Case:
    doc = json.loads((TRACES / "rtx4090-throttled.json").read_text(encoding="utf-8"))
    result = dict(doc["result"]) | {"interrupted": True}
    result["steps"] = result["steps"][:6]
    return _trace("rtx4090-throttled", result, plan(), interrupted=True)


def _tokens() -> Case:
    """A token model (tokens/s, per million tokens), priced, with a batch sweep that ends in an OOM."""
    doc = json.loads((TRACES / "h100-launch-bound.json").read_text(encoding="utf-8"))
    data = synthetic_spec("tokens", 64, 10, 512).to_json() | {"reader": "checks.verify.smoke.data.SyntheticTokens"}
    rows = [{"batch": 32, "median_step_s": 0.05, "samples_per_s": 640.0, "peak_reserved_bytes": 2 * 2**30}]
    rows.append({"batch": 64, "oom": True})
    result = dict(doc["result"]) | {"data": data, "sweep": {"rows": rows, "knee_batch": 32}}
    return _trace("h100-launch-bound", result, plan(synthetic_spec("tokens", 64, 10, 512), price=4.0))


def _ddp_hosts() -> Case:
    """The gloo run as --hosts joins it: every rank's host under ``ddp.hosts``."""
    doc = json.loads((RUNS / "cpu-ddp-gloo.json").read_text(encoding="utf-8"))
    result = dict(doc["result"])
    hosts = [{"host": "a", "address": "10.0.0.1", "ranks": [0]}, {"host": "b", "address": "10.0.0.2", "ranks": [1]}]
    result["ddp"] = result["ddp"] | {"hosts": hosts}
    child = ChildRun(result=ChildResult.from_json(result), seconds=30.0)
    return plan(None, 0.0, 500, 2.0), Outcome(child, Trace(), None, "not run with --hosts"), None


def _ddp() -> Case:
    gate = [ok("driver", "no driver: a CPU box"), warn("cpu-cores", "2 usable cores", "rent more cores")]
    return _recorded("cpu-ddp-gloo", plan(None, 0.0, 500, 2.0), gate)


CASES: dict[str, Callable[[], Case]] = {
    **{name: _gpu(name) for name in sorted(p.stem for p in TRACES.glob("*.json"))},
    "a100-fragmented-priced": _gpu("a100-fragmented", price=2.5),
    "l4-staged-priced": _gpu(
        "l4-h2d-bound",
        data=DataSpec("images", "staged", 120_000, "data/staged", image_size=64, classes=10),
        price=0.8,
    ),
    "cpu-data-bound": lambda: _recorded("cpu-data-bound", plan(None, 1.2, 5, 2.0)),
    "cpu-ddp-gloo": _ddp,
    "cpu-ddp-hosts": _ddp_hosts,
    "tokens-sweep-priced": _tokens,
    "oom": _oom,
    "crashed": _crashed,
    "killed": _killed,
    "interrupted": _interrupted,
}


def _command(name: str) -> dict[str, Any]:
    """A ``verify -- COMMAND`` run recorded on a CPU box (``runs/command-*.json``: the launcher's ``CommandRun``,
    every agent event in it, and the stop rule's warm-up and steps), judged by the command's judge."""
    doc = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    raw = doc["run"]
    run = CommandRun(**{k: v for k, v in raw.items() if k != "pids"}, pids=set(range(raw["pids"])))
    files = Files("reports/r.json", "reports/r.samples.csv", "reports/r.png")
    results, m, verdicts = command_judge(run, Trace(), Setting(2.0, files, own_code=True), CFG, doc["warmup"],
                                         doc["steps"], 0.0, None)  # fmt: skip
    out = {"results": [r.to_json() for r in results], "measurements": m.to_json()}
    return out | {"verdicts": [v.as_dict() for v in verdicts]}


COMMANDS = sorted(p.stem for p in RUNS.glob("command-*.json"))
ALL = [*CASES, *COMMANDS]


def judged(name: str) -> dict[str, Any]:
    """The case's results, measurements and verdicts as the JSON report writes them."""
    if name in COMMANDS:
        doc = _command(name)
    else:
        p, o, gate = CASES[name]()
        j = judge(p, o, CFG, gate)
        doc = {"results": [r.to_json() for r in j.results], "measurements": j.measurements.to_json()}
        doc |= {"verdicts": [v.as_dict() for v in j.verdicts]}
    return json.loads(json.dumps(doc, default=str))


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
