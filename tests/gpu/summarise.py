"""Summarise a GPU acceptance run (``tests/gpu/acceptance.sh``), and name its recorded snapshot fixture.

    python tests/gpu/summarise.py summary OUT_DIR
    python tests/gpu/summarise.py fixture SNAPSHOT FIXTURE_DIR [COPY_DIR ...]

``summary`` reads what the run left in OUT_DIR (plan.tsv and steps.tsv from the script, bootstrap.json,
snapshot.json, verify/*.json, allreduce.json, gpu-tests.xml, logs/) and writes summary.json and summary.md: each
step with its status, exit code and seconds, and every benchmark figure as a fraction of its datasheet value (the
figures and datasheet rows of ``checks/machine/bench.py`` and ``checks/tables/datasheet.py``).
``fixture`` copies the snapshot to ``recorded-<gpu>-<n>x.json``, the GPU named by its datasheet model.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from checks.facts import GpuBench  # noqa: E402 - the checkout is not installed
from checks.machine.bench import METRICS  # noqa: E402
from checks.tables import datasheet  # noqa: E402
from tests.gpu.summary_md import render_md  # noqa: E402

SCHEMA = 1
VERIFY_RUNS = ("image", "text", "data", "sweep", "ab", "cmd-photos", "cmd-lm", "cmd-ddp")
# GPU paths this run does not exercise: said in every summary, so none is forgotten.
NOT_COVERED = (
    "the built-in loop's DDP legs on NCCL (verify --nproc N): not run; cmd-ddp runs a user's DDP under torchrun",
    "the plan's memory estimate vs torch.cuda.max_memory_allocated: not compared",
)


@dataclass(frozen=True)
class Figure:
    """One measured figure and, where the table has one, its datasheet value."""

    source: str  # "snapshot", "bootstrap", "verify-image", ...
    gpu: str  # "gpu0 NVIDIA H200"
    metric: str  # "gpu-matmul", "verify-mfu", ...
    value: float
    unit: str
    datasheet: float | None
    note: str = ""

    @property
    def fraction(self) -> float | None:
        return round(self.value / self.datasheet, 4) if self.datasheet else None


# --- the recorded fixture ------------------------------------------------------------------------------------------


def slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'h200-sxm' (the datasheet model); a card not in the table keeps its own name."""
    spec = datasheet.lookup(gpu_name)
    name = spec.model if spec else re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", gpu_name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def fixture_name(snapshot: dict[str, Any]) -> str:
    """``recorded-<gpu>-<n>x.json`` for a snapshot document (the first GPU names a mixed box)."""
    gpus = snapshot["machine"]["nvml"]["gpus"]
    if not gpus:
        raise ValueError(f"the snapshot holds no GPU (NVML: {snapshot['machine']['nvml'].get('error')})")
    return f"recorded-{slug(gpus[0]['name'])}-{len(gpus)}x.json"


def keep_fixture(snapshot_path: Path, fixture_dir: Path, copies: list[Path]) -> Path:
    """Copy a recorded snapshot into the fixtures (and each of ``copies``) under its fixture name."""
    doc = json.loads(snapshot_path.read_text(encoding="utf-8"))
    if doc.get("recorded") is not True:
        raise ValueError(f"{snapshot_path} is not marked recorded")
    name = fixture_name(doc)
    for folder in (fixture_dir, *copies):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(snapshot_path, folder / name)
    return fixture_dir / name


# --- figures -------------------------------------------------------------------------------------------------------


def _bench(row: dict[str, Any]) -> GpuBench:
    known = {f.name for f in fields(GpuBench)}
    return GpuBench(**{k: v for k, v in row.items() if k in known})


def bench_figures(source: str, rows: list[dict[str, Any]], names: dict[int, str]) -> list[Figure]:
    """Each micro-benchmark figure of each GPU against its datasheet value (bootstrap's own metric table)."""
    out = []
    for row in rows:
        b = _bench(row)
        name = names.get(b.index, "unknown")
        spec = datasheet.lookup(name)
        for metric in METRICS:
            value = metric.read(b)
            if value is None:
                continue
            expected = metric.spec(spec, b) if spec else None
            note = "" if spec else f"{name} is not in templates/gpus.yaml"
            if metric.id == "gpu-matmul":
                note = f"{b.matmul_dtype}" + (f"; {note}" if note else "")
            out.append(Figure(source, f"gpu{b.index} {name}", metric.id, value, metric.unit, expected, note))
    return out


def mfu_figure(source: str, report: dict[str, Any]) -> Figure | None:
    """verify's MFU as achieved TFLOPS against the dense datasheet peak it used."""
    mfu = report.get("measurements", {}).get("mfu") or {}
    value, peak = mfu.get("value"), mfu.get("peak_tflops")
    if value is None or not peak:
        return None
    device = (report.get("measurements", {}).get("run") or {}).get("device") or {}
    gpu = device.get("name", "") if isinstance(device, dict) else str(device)
    return Figure(source, gpu, "verify-mfu", round(value * peak, 2), "TFLOPS", peak, mfu.get("note", ""))


def allreduce_figures(doc: dict[str, Any]) -> list[Figure]:
    """The best bus bandwidth of the sweep; the table holds no NVLink bandwidth, so no fraction."""
    rows = doc.get("rows") or []
    if not rows:
        return []
    best = max(rows, key=lambda r: r["busbw_gb_s"])
    note = f"{doc.get('backend')} x{doc.get('world_size')}, {best['bytes'] // 2**20} MiB messages; no datasheet figure"
    return [Figure("allreduce", "all", "busbw", best["busbw_gb_s"], "GB/s", None, note)]


# --- reading the run -----------------------------------------------------------------------------------------------


def _json(path: Path) -> dict[str, Any] | None:
    """A JSON object file (the last non-empty line of a file that also holds log lines), or None."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    for candidate in (text, *reversed(text.splitlines())):
        try:
            doc = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _tsv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    except OSError:
        return []


def steps(out: Path) -> list[dict[str, Any]]:
    """Each planned step with what became of it; a step the run never reached is 'not run'."""
    done = {row["name"]: row for row in _tsv(out / "steps.tsv")}
    rows = []
    for plan in _tsv(out / "plan.tsv"):
        if plan["name"] == "summary":
            continue
        row = done.get(plan["name"], {})
        rc = row.get("rc", "")
        rows.append(
            {
                "name": plan["name"],
                "status": row.get("status", "not run"),
                "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                "seconds": int(row["seconds"]) if row.get("seconds", "").isdigit() else None,
                "timeout_s": int(row.get("timeout_s") or plan["timeout_s"]),
                "note": row.get("note") or _log_tail(out / "logs" / f"{plan['name']}.log", row.get("status")),
                "command": plan["command"],
            }
        )
    return rows


def _log_tail(log: Path, status: str | None) -> str:
    """The torch step says which torch it used; a failed step shows its last line."""
    if status not in ("failed", "timeout") and log.name != "torch.log":
        return ""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else ""


def gpu_names(out: Path, bootstrap: dict[str, Any] | None) -> dict[int, str]:
    """NVML index -> name: the snapshot's GPUs, else bootstrap's inventory in order."""
    snapshot = _json(out / "snapshot.json")
    if snapshot and snapshot.get("machine"):
        return {g["index"]: g["name"] for g in snapshot["machine"]["nvml"]["gpus"]}
    names = ((bootstrap or {}).get("measurements", {}).get("inventory") or {}).get("gpu_names") or []
    return dict(enumerate(names))


def machine(names: dict[int, str], snapshot: dict[str, Any] | None, bootstrap: dict[str, Any] | None) -> dict[str, Any]:
    """The card, driver and torch a BENCHMARKS.md section names."""
    facts = (snapshot or {}).get("machine") or {}
    nvml, torch = facts.get("nvml") or {}, facts.get("torch") or {}
    inventory = (bootstrap or {}).get("measurements", {}).get("inventory") or {}
    return {
        "gpus": [names[i] for i in sorted(names)],
        "driver": nvml.get("driver_version"),
        "torch": torch.get("version") or inventory.get("torch"),
        "torch_cuda": torch.get("cuda"),
        "host": (bootstrap or {}).get("host"),
    }


def not_ok(source: str, report: dict[str, Any] | None) -> list[str]:
    rows = (report or {}).get("results") or []
    return [
        f"{source}: {r['status']} {r['id']}" + (f" @ {r['subject']}" if r.get("subject") else "") + f": {r['summary']}"
        for r in rows
        if r.get("status") in ("fail", "warn", "error")
    ]


def gpu_samples(csv_path: Path) -> int | None:
    """Sampler rows with GPU 0's utilisation answered: the sampler's GPU columns on a real driver."""
    try:
        with csv_path.open(encoding="utf-8", newline="") as fh:
            return sum(1 for row in csv.DictReader(fh) if row.get("gpu0_util_pct"))
    except OSError:
        return None


def verify_run(name: str, report: dict[str, Any], csv_path: Path) -> dict[str, Any]:
    m = report.get("measurements", {})
    run = m.get("run") or {}
    device = run.get("device") if isinstance(run.get("device"), dict) else {}
    mfu = m.get("mfu") or {}
    return {
        "run": name,
        "device": (device or {}).get("name") or (device or {}).get("type"),
        "precision": run.get("precision"),
        "batch_size": run.get("batch_size"),
        "samples_per_s": m.get("samples_per_s"),
        "tokens_per_s": m.get("tokens_per_s"),
        "median_step_s": (m.get("step_time") or {}).get("median_s"),
        "mfu": mfu.get("value"),
        "mfu_note": mfu.get("note"),
        "verdict": (m.get("diagnosis") or {}).get("verdict"),
        "gpu_samples": gpu_samples(csv_path),
        "counts": report.get("counts"),
    }


def gpu_tests(xml_path: Path) -> dict[str, Any] | None:
    """Outcome of each gpu-marked test from pytest's JUnit XML."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome, message = tag, (child.get("message") or "")[:300]
        cases.append({"name": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "message": message})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    return {"counts": counts, "cases": cases}


def summarise(out: Path) -> dict[str, Any]:
    """Everything the run left in ``out``, as one JSON-ready document."""
    bootstrap, snapshot = _json(out / "bootstrap.json"), _json(out / "snapshot.json")
    names = gpu_names(out, bootstrap)
    figures: list[Figure] = []
    if snapshot and snapshot.get("machine"):
        figures += bench_figures("snapshot", (snapshot["machine"].get("bench") or {}).get("gpus") or [], names)
    if bootstrap:
        figures += bench_figures("bootstrap", bootstrap.get("measurements", {}).get("gpu_bench") or [], names)
    runs, findings = [], not_ok("bootstrap", bootstrap)
    for name in VERIFY_RUNS:
        report = _json(out / "verify" / f"{name}.json")
        if report is None:
            continue
        runs.append(verify_run(name, report, out / "verify" / f"{name}.samples.csv"))
        findings += not_ok(f"verify-{name}", report)
        mfu = mfu_figure(f"verify-{name}", report)
        figures += [mfu] if mfu else []
    allreduce = _json(out / "allreduce.json")
    figures += allreduce_figures(allreduce or {})
    return {
        "schema": SCHEMA,
        "machine": machine(names, snapshot, bootstrap),
        "steps": steps(out),
        "figures": [asdict(f) | {"fraction": f.fraction} for f in figures],
        "verify": runs,
        "allreduce": (allreduce or {}).get("rows") or [],
        "gpu_tests": gpu_tests(out / "gpu-tests.xml"),
        "findings": findings,
        "not_covered": list(NOT_COVERED),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="write summary.json and summary.md into OUT_DIR")
    summary.add_argument("out", type=Path)
    fixture = sub.add_parser("fixture", help="copy a recorded snapshot to recorded-<gpu>-<n>x.json")
    fixture.add_argument("snapshot", type=Path)
    fixture.add_argument("fixture_dir", type=Path)
    fixture.add_argument("copies", type=Path, nargs="*")
    args = parser.parse_args(argv)
    if args.command == "fixture":
        try:
            path = keep_fixture(args.snapshot, args.fixture_dir, args.copies)
        except (OSError, ValueError, KeyError) as exc:
            print(f"no fixture: {exc}", file=sys.stderr)
            return 1
        print(f"kept {path} (add it to EXPECTED in tests/checks/test_fixtures.py before committing)")
        return 0
    doc = summarise(args.out)
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (args.out / "summary.md").write_text(render_md(doc), encoding="utf-8")
    print(render_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
