"""Benchmark: the exchange A/B of ``invoke verify --nproc 2`` (``checks/verify/user/exchange.py``) — what it costs
and how much its exposed-communication figure moves from run to run.

Run from the repository root:  python tests/bench/bench_ddp.py [--repeats N]
It rewrites the "ddp" section of BENCHMARKS.md. Two gloo ranks on this machine's CPU: the torchrun command of the
tool's script ``templates/train.py`` exactly as ``invoke verify --nproc 2`` builds it (``checks.verify.builtin.
prepare``), for two planted models: ``wide_model`` (32 MB of gradients, a few ms of compute: the exchange is most
of a step) and ``tiny_model`` (12 KB of gradients: nearly no exchange, the control). Each repeat is the measured
run (``run_command`` under the agent, stopped after verify's warm-up and ``--steps``), whose comm hook times the
exchange left after the last bucket, then the A/B as ``verify`` runs it after a measured run: re-runs of the
unchanged command alternated with re-runs whose exchange the agent skips (unchanged, skipped, unchanged,
skipped). Per model: the A/B's wall time and its share of measured run + A/B, the exposed exchange by A/B (median
and range over the repeats) against the hook's, the skipped leg's mean step, and the unchanged leg's run-to-run
spread inside one A/B.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
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
from checks.verify.builtin import prepare  # noqa: E402
from checks.verify.plan import Options  # noqa: E402
from checks.verify.user import exchange  # noqa: E402
from checks.verify.user import judge as j  # noqa: E402
from checks.verify.user.launch import StopRule, run_command  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:ddp:begin -->", "<!-- bench:ddp:end -->"
PLUGINS = "tests.checks.verify.planted_plugins"  # the planted datasets and models (--dataset/--model MODULE:NAME)
WARMUP = make_config().verify.warmup  # verify's: the script saves at the step after it, as under invoke verify
STEPS = 6  # the measured run's steps: few, as before (the A/B no longer depends on them)

# What this section held before, measured on the removed built-in loop's no_sync windows inside one child run
# (--repeats 3 --windows 2,4,8; Intel(R) Xeon(R) Processor, 2 usable cores; load average 4.3 at the end), quoted.
BEFORE_TABLE = """\
| model (gradients) | windows | A/B phase | exposed comm, median (range) | no_sync step | sync leg spread |
|---|---|---|---|---|---|
| wide_model (32.01 MB) | 2 x 2 x 3 | 0.64 s (4% of the run) | 68.3 ms (51.6..69.7) | 10.0 ms | 16.0 ms |
| wide_model (32.01 MB) | 4 x 2 x 3 | 1.46 s (8% of the run) | 67.6 ms (64.3..101.1) | 18.4 ms | 27.9 ms |
| wide_model (32.01 MB) | 8 x 2 x 3 | 1.96 s (16% of the run) | 48.2 ms (34.1..54.9) | 13.3 ms | 8.3 ms |
| tiny_model (0.01 MB) | 2 x 2 x 3 | 0.08 s (1% of the run) | 3.8 ms (3.1..8.7) | 1.0 ms | 2.4 ms |
| tiny_model (0.01 MB) | 4 x 2 x 3 | 0.05 s (1% of the run) | 1.4 ms (1.3..1.7) | 0.8 ms | 0.6 ms |
| tiny_model (0.01 MB) | 8 x 2 x 3 | 0.09 s (3% of the run) | 0.6 ms (0.5..1.4) | 0.8 ms | 1.3 ms |"""


def machine() -> MachineFacts:
    """This host without the torch probe: no GPU, so two processes are gloo ranks on the CPU."""
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host())


def one_run(model: str, advice_s: float) -> dict[str, Any]:
    """The measured run of ``invoke verify --nproc 2`` (no sampler) and the A/B verify runs after it."""
    cfg = make_config()
    cfg = dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, image_size=16, batch_size_cpu=16))
    opts = Options(json="/dev/null", nproc=2, workers=0, dataset=f"{PLUGINS}:patterned", model=f"{PLUGINS}:{model}")
    with ExitStack() as stack:
        b, _ = prepare(opts, cfg, machine, stack, WARMUP)
        assert b.processes == 2, b.command
        start = time.monotonic()
        run = run_command(b.command, StopRule(WARMUP, STEPS), str(ROOT), None, subprocess.DEVNULL)
        wall = time.monotonic() - start
        found = j.ranks(run.events, WARMUP, STEPS, 0.0)
        if run.ended != "stopped" or len(found) != 2:
            raise SystemExit(f"{model}: the measured run {run.ended}: {run.traceback()}")
        hooked = j.rank_rows(found, j.rank_zero(found), run.events)
        start = time.monotonic()
        ab = exchange.measure(b.command, str(ROOT), advice_s)
        ab_s = time.monotonic() - start
    figures = exchange.figures(ab, make_config().verify.exchange_ab_tolerance)
    if figures is None:
        raise SystemExit(f"{model}: no A/B: {ab}")
    saves = [s.checkpoint for s in (j.rank_zero(found) or found[0]).steps]
    return {
        "ab": figures.to_json(), "raw": ab, "ab_s": ab_s, "wall_s": wall, "grad_bytes": hooked.grad_bytes or 0,
        "hook_ms": hooked.comm_exposed_ms, "save_s": max(saves, default=0.0),
    }  # fmt: skip


def spread(xs: list[float]) -> str:
    return f"{min(xs):.1f}..{max(xs):.1f}"


def row(model: str, runs: list[dict[str, Any]]) -> str:
    exposed = [1000 * max(0.0, x["ab"]["sync_median_s"] - x["ab"]["no_sync_median_s"]) for x in runs]
    hook = [x["hook_ms"] for x in runs if x["hook_ms"] is not None]
    ab = [x["ab_s"] for x in runs]
    share = statistics.median(x["ab_s"] / (x["wall_s"] + x["ab_s"]) for x in runs)
    legs = [1000 * (x["ab"]["sync_spread_s"] or 0) for x in runs]
    skips = [1000 * (x["ab"]["no_sync_spread_s"] or 0) for x in runs]
    skip = statistics.median(1000 * x["ab"]["no_sync_median_s"] for x in runs)
    sync = statistics.median(1000 * x["ab"]["sync_median_s"] for x in runs)
    wall = statistics.median(x["wall_s"] for x in runs)
    pairs = min(x["ab"]["windows"] for x in runs)
    save = statistics.median(1000 * x["save_s"] for x in runs)
    grad = runs[0]["grad_bytes"] / 1e6
    return (
        f"| {model} ({grad:.2f} MB) | {pairs} x 2 x {exchange.RERUN_STEPS} | {statistics.median(ab):.1f} s "
        f"({100 * share:.0f}% of run + A/B; measured run {wall:.1f} s) | {statistics.median(exposed):.1f} ms "
        f"({spread(exposed)}) | {f'{statistics.median(hook):.1f} ms' if hook else '-'} | {sync:.1f} ms "
        f"| {skip:.1f} ms | {statistics.median(legs):.1f} / {statistics.median(skips):.1f} ms | {save:.0f} ms "
        f"| {os.getloadavg()[0]:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--advice-s", type=float, default=make_config().verify.command_advice_s,
                        help="the A/B's seconds (verify.command_advice_s)")  # fmt: skip
    args = parser.parse_args()
    os.chdir(ROOT)  # --dataset/--model import paths resolve from the current directory
    os.environ["OMP_NUM_THREADS"] = "1"  # one intra-op thread per rank (a shared 2-core box)
    load, started = os.getloadavg()[0], time.monotonic()
    rows = []
    for model in ("wide_model", "tiny_model"):
        runs = [one_run(model, args.advice_s) for _ in range(args.repeats)]
        rows.append(row(model, runs))
        print(rows[-1], f"load {os.getloadavg()[0]:.1f}", [x["raw"] for x in runs], flush=True)
    took = time.monotonic() - started
    host = read_host()
    section = "\n".join(
        [
            BEGIN,
            "## ddp (verify --nproc: the exchange A/B)",
            "",
            f"Machine: {host.cpu_model or platform.processor()}, {host.usable_cores:g} usable cores, Python "
            f"{platform.python_version()}; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
            f"{took / 60:.0f} min for the whole bench (a box shared with other jobs).",
            f"`python tests/bench/bench_ddp.py --repeats {args.repeats}`: two gloo ranks of one thread each, the",
            "torchrun command of the tool's script `templates/train.py` as `invoke verify --nproc 2` builds it",
            f"(batch 16 of 16 px images per rank, `--workers 0`); each row is {args.repeats} repeats of: the measured",
            f"run under the agent ({WARMUP} warm-up + {STEPS} steps), then the A/B of",
            "`checks/verify/user/exchange.py` as verify runs it after that run: whole re-runs of the command, the",
            "unchanged ones alternated with ones whose gradient exchange the agent skips (pairs x legs x measured",
            f"steps per re-run, after {exchange.RERUN_WARMUP} warm-up steps each). Its wall time and share of",
            "measured run + A/B; exposed exchange = unchanged minus skipped mean step of rank 0, median (min..max)",
            "over the repeats; the comm hook's own figure in the measured run (from the last bucket handed to the",
            "all-reduce to the end of backward); each leg's mean step (data wait + forward + backward + optimizer:",
            "the A/B's figure; the optimizer is AdamW); each leg's spread (max - min of its re-runs: the noise one",
            "A/B sits in); the script's one save in the measured run (outside the step time; every re-run of the",
            "tool's script saves once too). These are the tool's script under the agent; the figures before were the",
            "removed built-in loop's no_sync windows inside one child run (barriers between windows, 3 steps",
            "each), which the command path has no counterpart of: its A/B is whole re-runs, so `--windows` is gone.",
            "",
            "| model (gradients) | pairs x legs x steps | A/B | exposed comm by A/B, median (range) | comm hook "
            "| unchanged leg step | skipped leg step | leg spread, unchanged / skipped | save in the measured run "
            "| load average after |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Before (built-in loop, removed), quoted as it was:",
            "",
            BEFORE_TABLE,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
