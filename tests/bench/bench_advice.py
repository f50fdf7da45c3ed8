"""Benchmark "advice applied": does verify's first loader fix make the loop faster when applied?

Run from the repository root:  python tests/bench/bench_advice.py [--steps N]
It rewrites the "advice applied" section of BENCHMARKS.md. For each planted and real pipeline of the tests
(tests/checks/verify/smoke_plugins.py), verify runs on the CPU below the CLI (plan -> child under the sampler ->
judge), its ``measurements.advice`` is applied (``num_workers``; ``pin_memory`` needs a GPU), and verify runs
again. Throughput is the loop's training samples/s (``measurements.samples_per_s``). Target: never
slower; faster wherever the verdict is not compute-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import PreflightConfig, make_config  # noqa: E402
from checks.facts import MachineFacts, NvmlFacts, TorchFacts  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from checks.verify.plan import Options, plan, run  # noqa: E402
from checks.verify.report import judge  # noqa: E402
from tests.bench.benchmarks_md import cpu_machine_line, write_section  # noqa: E402

BEGIN, END = "<!-- bench:advice:begin -->", "<!-- bench:advice:end -->"
PLUGINS = "tests.checks.verify.smoke_plugins"

# (name, kind, --dataset, --model, --workers, image_size): the tests' pipelines, the issue's 8-workers case among them
PIPELINES = (
    ("memory-mapped 256 px samples", "planted", "mapped", "strided_model", 2, 16),
    ("JPEG photos, jitter + blur", "real", "blurred_photos", "tiny_model", 0, 16),
    ("JPEG photos, jitter + blur, 8 workers", "real", "blurred_photos", "tiny_model", 8, 16),
    ("10 ms CPU per sample, 8 workers", "planted", "busy", "tiny_model", 8, 16),
    ("4 ms sleep per sample (slow reads)", "planted", "sleepy", "tiny_model", 1, 16),
    ("built-in CNN, 32 px synthetic", "planted", "", "", 1, 32),
)


def config(steps: int, image_size: int, probe: bool) -> PreflightConfig:
    cfg = make_config()
    small = dataclasses.replace(
        cfg.verify, steps=steps, warmup=3, image_size=image_size, batch_size_cpu=16, sample_interval_s=0.05
    )
    if not probe:  # runs that only time the loop skip the loader probe (it comes after the measured steps anyway)
        small = dataclasses.replace(small, loader_probe_s=0.0)
    return dataclasses.replace(cfg, verify=small)


def machine() -> MachineFacts:
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())


def verify(cfg: PreflightConfig, dataset: str, model: str, workers: int) -> dict[str, Any]:
    """One verify run below the CLI; its measurements."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        opts = Options(json=str(Path(tmp) / "r.json"), workers=workers, dataset=dataset, model=model)
        p, _ = plan(opts, cfg, machine, stack)
        _, m, _ = judge(p, run(p, cfg, lambda e: None), cfg.verify)
    return m.to_json()


def row(name: str, kind: str, dataset: str, model: str, workers: int, image_size: int, steps: int) -> str:
    """before (verify, advice), after, after, before: each side's mean of two runs, so drift on the shared box
    hits both alike (ABBA)."""
    ds, md = (f"{PLUGINS}:{dataset}" if dataset else ""), (f"{PLUGINS}:{model}" if model else "")
    first = verify(config(steps, image_size, True), ds, md, workers)
    advice = first.get("advice")
    applied = advice["num_workers"] if advice and advice["faster"] else workers
    timing = config(steps, image_size, False)
    after = [verify(timing, ds, md, applied) for _ in range(2)]
    before = [first, verify(timing, ds, md, workers)]
    a, b = (statistics.fmean(m["samples_per_s"] for m in runs) for runs in (before, after))
    verdict = first["diagnosis"]["verdict"]
    fix = (
        f"num_workers {workers} -> {applied} (alone: {advice['current_samples_s']:,.0f} -> "
        f"{advice['measured_samples_s']:,.0f}/s)"
        if advice and applied != workers
        else "none measured faster: unchanged"
        if advice
        else "no loader fix (not measured)"
    )
    runs = " / ".join(f"{m['samples_per_s']:,.1f}" for m in (*before, *after))
    print(f"{name}: {verdict}; {fix}; {a:.1f} -> {b:.1f} samples/s ({runs})", flush=True)
    return f"| {name} ({kind}) | {verdict} | {fix} | {a:,.1f} | {b:,.1f} | {b / a - 1:+.0%} | {runs} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    os.chdir(ROOT)  # --dataset/--model import paths resolve from the current directory
    os.environ["OMP_NUM_THREADS"] = "1"  # one intra-op thread in the child, as the tests (a shared 2-core box)
    rows = [row(*p, args.steps) for p in PIPELINES]
    section = "\n".join(
        [
            BEGIN,
            "## advice applied (`invoke verify`'s measured loader fix)",
            "",
            "`python tests/bench/bench_advice.py`: verify on each pipeline of the tests, its first advised setting",
            "(`measurements.advice`) applied, verify again. Training samples/s of the loop (checkpoints excluded),",
            f"{args.steps} measured steps, batch 16, one intra-op thread; 'alone' is the DataLoader's own rate that",
            "verify measured for the current and the advised setting. Each side is the mean of two runs taken",
            "before, after, after, before (drift on the shared box hits both alike). Target: never",
            "slower; faster wherever the verdict is not compute-bound.",
            "",
            "| pipeline | verdict | advice applied | before, samples/s | after | change | runs: before x2, after x2 |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Machine: {cpu_machine_line()}; load average {os.getloadavg()[0]:.1f} at the end (a box shared with other",
            "jobs: a few percent between two runs of the same setting is noise).",
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)


if __name__ == "__main__":
    main()
