"""Benchmark: how long the test suite and its fast subset take, this checkout against an earlier commit.

Run from the repository root:  python tests/bench/bench_suite.py --before REF [--full]
The earlier commit is checked out into a temporary git worktree; both trees run with this Python, one after the
other on the same cores (fast subset: ``pytest -m "not slow"``; with ``--full`` the whole suite too). It rewrites
the "test suite" section of BENCHMARKS.md with the times, the test counts and the machine.

Each run also gives the CPU seconds its processes used (pytest and every child it waited for: user + system) and
the load average when it started: on a box that other work shares, wall time stretches with the load and the CPU
seconds much less, so the pair tells a slower suite from a busier box.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:suite:begin -->", "<!-- bench:suite:end -->"
TALLY = re.compile(r"(\d+) passed(?:, (\d+) failed)?")


def timed_pytest(tree: Path, *args: str) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds and the 1-minute load average at the start of one ``pytest -q`` in ``tree``, and
    its closing tally ("1207 passed, 8 skipped")."""
    load = os.getloadavg()[0]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tree,
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"},
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime
    last = [line for line in proc.stdout.splitlines() if TALLY.search(line)]
    return seconds, used, load, (last[-1].strip("= ") if last else f"exit {proc.returncode}")


def cell(run: tuple[float, float, float, str]) -> str:
    seconds, used, load, tally = run
    return f"{seconds:.0f} s wall, {used:.0f} s CPU, load {load:.1f} ({tally})"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="the earlier commit (e.g. the one before a refactor)")
    parser.add_argument("--full", action="store_true", help="also time the whole suite (minutes each)")
    parser.add_argument("--note", default="a quiet box", help="what else ran on the box meanwhile, for the record")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), args.before], cwd=ROOT, check=True)
        try:
            rows = []
            runs = [('fast subset (`-m "not slow"`)', ("-m", "not slow"))] + (
                [("whole suite", ())] if args.full else []
            )
            for name, extra in runs:
                old = timed_pytest(before, *extra)
                new = timed_pytest(ROOT, *extra)
                rows.append(f"| {name} | {cell(old)} | {cell(new)} |")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    section = "\n".join(
        [
            BEGIN,
            "## test suite",
            "",
            f"Machine: {machine()}, no GPU. `python tests/bench/bench_suite.py --before {args.before}"
            + (" --full" if args.full else "")
            + f"`: commit {args.before} in a git worktree, then this checkout ({head.stdout.strip()}), one after the"
            " other on the same cores. The counts differ where the tests changed in between. CPU: seconds used by"
            " pytest and the children it waited for; load: the 1-minute load average when the run started"
            f" ({args.note}).",
            "",
            f"| run | before ({args.before}) | after ({head.stdout.strip()}) |",
            "|---|---|---|",
            *rows,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
