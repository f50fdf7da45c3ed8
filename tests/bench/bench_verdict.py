"""Benchmark "time to verdict": verify within its default budget against a run of 5x the steps.

Run from the repository root:  python tests/bench/bench_verdict.py
It rewrites the "time to verdict" section of BENCHMARKS.md. For each planted and real pipeline of the tests
(tests/checks/verify/smoke_plugins.py), ``invoke verify`` runs on the CPU as the task does (``run.verify``: the
gate's torch probe, the child, the checkpoint round trip, the loader probe, the report) with the default budget
(``verify.budget``), then again with ``--steps`` five times the steps the short run measured and a budget that
cuts nothing. Target: the short run's verdict within 120 s on any pipeline, the same verdict as the
long run's, and shares close to it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import PreflightConfig, make_config  # noqa: E402
from checks.verify import run as run_verify  # noqa: E402
from checks.verify.plan import Options  # noqa: E402
from tests.bench.benchmarks_md import cpu_machine_line, write_section  # noqa: E402

BEGIN, END = "<!-- bench:verdict:begin -->", "<!-- bench:verdict:end -->"
PLUGINS = "tests.checks.verify.smoke_plugins"
LONG_BUDGET = "3600"  # the long run: nothing cut

# (name, kind, --dataset, --model, --workers, image_size, environment)
PIPELINES: tuple[tuple[str, str, str, str, int, int, dict[str, str]], ...] = (
    ("4 s a step (a model too big for the box)", "planted", "patterned", "slow_model", 0, 16, {"SMOKE_STEP_S": "4"}),
    ("4 ms sleep per sample (slow reads), 1 worker", "planted", "sleepy", "tiny_model", 1, 16, {}),
    ("10 ms CPU per sample, 4 workers", "planted", "busy", "tiny_model", 4, 16, {}),
    ("built-in CNN, 32 px synthetic", "planted", "", "", 1, 32, {}),
    ("JPEG photos (scikit-image), jitter + blur, in process", "real", "blurred_photos", "tiny_model", 0, 16, {}),
    ("JPEG photos (scikit-image), jitter + blur, 2 workers", "real", "blurred_photos", "tiny_model", 2, 16, {}),
)


def config(image_size: int) -> PreflightConfig:
    """verify's defaults (budget, steps, warm-up, loader probe), with the tests' small images and batch."""
    cfg = make_config()
    return dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, image_size=image_size, batch_size_cpu=16))


def verify(cfg: PreflightConfig, dataset: str, model: str, workers: int, steps: int, budget: str) -> dict[str, Any]:
    """One ``invoke verify`` below the CLI (the task's own function); its measurements and wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = Options(json=str(Path(tmp) / "r.json"), workers=workers, dataset=dataset, model=model, steps=steps)
        started = time.monotonic()
        judged = run_verify.verify(run_verify.VerifyRequest(cfg, opts, budget), say=lambda line: None)
        wall = time.monotonic() - started
    return judged.report.measurements | {"wall_s": wall}


def cpu_in_waits(m: dict[str, Any]) -> str:
    """ "ours / the box's" % of the usable cores while the loop waited for data (the data verdict's evidence)."""
    for v in m["diagnosis"]["verdicts"]:
        ev = v.get("evidence") or {}
        if v["id"] in ("data-bound", "cpu-starved") and ev.get("cpu_during_wait") is not None:
            box = ev.get("machine_cpu_during_wait")
            return f"{100 * ev['cpu_during_wait']:.0f} / {'-' if box is None else f'{100 * box:.0f}'}"
    return "-"


def row(name: str, kind: str, dataset: str, model: str, workers: int, size: int, env: dict[str, str]) -> str:
    os.environ.update(env)
    ds, md = (f"{PLUGINS}:{dataset}" if dataset else ""), (f"{PLUGINS}:{model}" if model else "")
    cfg = config(size)
    short = verify(cfg, ds, md, workers, 0, "")
    timed = short["time_to_verdict"]
    measured = short["step_time"]["steps"]
    long = verify(cfg, ds, md, workers, 5 * measured, LONG_BUDGET)
    for key in env:
        os.environ.pop(key)
    a, b = short["diagnosis"]["verdict"], long["diagnosis"]["verdict"]
    sa, sb = short["step_breakdown"], long["step_breakdown"]
    diff = max(abs(sa[k] - sb[k]) for k in sa)
    stop = timed["stop"]
    cuts = "; ".join(c["part"] for c in timed["cuts"]) or "none"
    shares = " / ".join(f"{100 * sa[k]:.0f}" for k in ("data_wait", "forward", "backward", "optimizer"))
    shares_long = " / ".join(f"{100 * sb[k]:.0f}" for k in ("data_wait", "forward", "backward", "optimizer"))
    print(
        f"{name}: short {a} in {timed['seconds']:.0f} s ({measured} steps, {stop['reason']}, cuts {cuts}); "
        f"long {b} in {long['wall_s']:.0f} s ({long['step_time']['steps']} steps); shares differ by "
        f"{100 * diff:.1f} points",
        flush=True,
    )
    return (
        f"| {name} ({kind}) | {a} | {timed['seconds']:.0f} | {measured} ({stop['reason']}) | {cuts} | {shares} "
        f"| {b} | {long['wall_s']:.0f} | {long['step_time']['steps']} | {shares_long} "
        f"| {'yes' if a == b else '**no**'} | {100 * diff:.1f} | {cpu_in_waits(short)} -> {cpu_in_waits(long)} |"
    )


def main() -> None:
    os.chdir(ROOT)  # --dataset/--model import paths resolve from the current directory
    os.environ["OMP_NUM_THREADS"] = "1"  # one intra-op thread in the child, as the tests (a shared 2-core box)
    load = os.getloadavg()[0]
    rows = [row(*p) for p in PIPELINES]
    budget = make_config().verify.budget
    section = "\n".join(
        [
            BEGIN,
            "## time to verdict (`invoke verify` within its budget against 5x the steps)",
            "",
            "`python tests/bench/bench_verdict.py`: each pipeline of the tests through `invoke verify`'s own function",
            f"(gate, child, checkpoint round trip, loader probe, report), first with the default budget ({budget:g} s",
            "for the whole command; warm-up 5, at most 30 measured steps, stopping once every share's 95% half-width",
            "is within 5 points after 20), then with `--steps` five times the steps the short run measured and",
            f"`--budget {LONG_BUDGET}` (nothing cut). Batch 16, one intra-op thread. Shares are data wait / forward /",
            "backward / optimizer, % of the step. Target: the verdict within 120 s on any pipeline, the",
            "same verdict as the long run's.",
            "",
            "| pipeline | short: verdict | time to verdict, s | steps (stop) | cut | shares | long: verdict | "
            "long: wall s | long: steps | long: shares | same verdict | largest share gap, points | "
            "CPU in the waits, % of the cores, ours / the box's: short -> long |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "`cpu-starved` is `data-bound` refined by the sampler: while the loop waits, the training processes use",
            "90% of the usable cores, or a quarter of that while the whole box is 90% busy (docs/verify.md#verdicts).",
            "Where only that refinement differs between the two runs, the shares agree and the last column shows",
            "which reading moved: the box's, which other jobs on a shared box move between two runs.",
            "",
            f"Machine: {cpu_machine_line()}; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
            "(a 2-core box shared with other jobs: step times, and so the shares, move with its load).",
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)


if __name__ == "__main__":
    main()
