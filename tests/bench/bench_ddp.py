"""Benchmark: the no_sync A/B of ``verify --nproc`` — what it costs and how much its exposed-communication figure
moves from run to run.

Run from the repository root:  python tests/bench/bench_ddp.py [--repeats N] [--windows 2,4,8]
It rewrites the "ddp" section of BENCHMARKS.md. Two gloo ranks on this machine's CPU, the real child and launcher,
for two planted models: ``wide_model`` (32 MB of gradients, a few ms of compute: the exchange is most of a step)
and ``tiny_model`` (12 KB of gradients: nearly no exchange, the control). For each number of window pairs: the A/B
phase's wall time, its share of the run, and over ``repeats`` runs the median exposed communication and its
spread (min..max), against each leg's own step-to-step spread inside a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.facts import MachineFacts, NvmlFacts, TorchFacts  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from checks.verify import distributed  # noqa: E402
from checks.verify.plan import Options, plan  # noqa: E402
from checks.verify.smoke.launch import launch  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:ddp:begin -->", "<!-- bench:ddp:end -->"
PLUGINS = "tests.checks.verify.smoke_plugins"
STEPS = 3  # window_steps: the default


def one_run(model: str, windows: int) -> dict[str, Any]:
    """One verify --nproc 2 child run (no sampler); the DDP figures and the A/B phase's wall time."""
    cfg = make_config()
    small: dict[str, Any] = {"steps": 6, "warmup": 2, "image_size": 16, "batch_size_cpu": 16, "ddp_windows": windows}
    cfg = dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, **small, ddp_window_steps=STEPS))
    facts = MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())
    opts = Options(json="/dev/null", nproc=2, workers=0, dataset=f"{PLUGINS}:patterned", model=f"{PLUGINS}:{model}")
    os.chdir(ROOT)
    with ExitStack() as stack:
        p, _ = plan(opts, cfg, lambda: facts, stack)
        start = time.monotonic()
        child = launch(p.spec, 600, 120)
        wall = time.monotonic() - start
    r = child.result
    if r is None or r.error or child.failure:
        raise SystemExit(f"{model}: the run failed: {(r.error if r else None) or child.failure}\n{child.log_tail}")
    comm = r.timeline["comm"]
    d = distributed.figures(r)
    assert d is not None
    return {"d": d.to_json(), "ab_s": comm[1] - comm[0], "wall_s": wall}


def spread(xs: list[float]) -> str:
    return f"{min(xs):.1f}..{max(xs):.1f}"


def row(model: str, windows: int, runs: list[dict[str, Any]]) -> str:
    exposed = [x["d"]["comm_exposed_ms"] for x in runs]
    ab = [x["ab_s"] for x in runs]
    share = statistics.median(x["ab_s"] / x["wall_s"] for x in runs)
    legs = [1000 * (x["d"]["ab"]["sync_spread_s"] or 0) for x in runs]
    steps = statistics.median(1000 * x["d"]["ab"]["no_sync_median_s"] for x in runs)
    grad = runs[0]["d"]["grad_bytes"] / 1e6
    return (
        f"| {model} ({grad:.2f} MB) | {windows} x 2 x {STEPS} | {statistics.median(ab):.2f} s ({100 * share:.0f}% of the run) "
        f"| {statistics.median(exposed):.1f} ms ({spread(exposed)}) | {steps:.1f} ms | {statistics.median(legs):.1f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--windows", default="2,4,8")
    args = parser.parse_args()
    rows = []
    for model in ("wide_model", "tiny_model"):
        for windows in [int(w) for w in args.windows.split(",")]:
            runs = [one_run(model, windows) for _ in range(args.repeats)]
            rows.append(row(model, windows, runs))
            print(rows[-1], flush=True)
    host = read_host()
    section = "\n".join(
        [
            BEGIN,
            "## ddp (verify --nproc: the no_sync A/B)",
            "",
            f"Machine: {host.cpu_model or platform.processor()}, {host.usable_cores:g} usable cores, Python "
            f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f} at the end (a box shared with other jobs).",
            f"`python tests/bench/bench_ddp.py --repeats {args.repeats} --windows {args.windows}`: two gloo ranks of one",
            "thread each, batch 16 of 16 px images per rank, the real launcher and child; each row is "
            f"{args.repeats} runs. Window pairs x legs x steps per window; the A/B phase's wall time (barriers",
            "included) and its share of the whole child run (start-up, warm-up, measure, checkpoint round trip, A/B,",
            "solo leg); exposed communication = synchronised minus no_sync median forward+backward of the slower rank,",
            "median (min..max) over the runs; the no_sync median step; the synchronised leg's step-to-step standard",
            "deviation inside a run (the noise one median sits in).",
            "",
            "| model (gradients) | windows | A/B phase | exposed comm, median (range) | no_sync step | sync leg spread |",
            "|---|---|---|---|---|---|",
            *rows,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
