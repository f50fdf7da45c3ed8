"""Benchmark: where `invoke bootstrap`'s time goes, live vs replayed, this checkout against an earlier commit.

Run from the repository root:  python tests/bench/bench_bootstrap.py [--repeats N] [--before REF]
With ``--before`` the earlier commit is checked out into a temporary git worktree and every timed run alternates
between the two trees (before, after, before, ...), so both see the same load. Each live run's JSON report gives
the phases of bootstrap's own time (``timing``, checks/result.py), whose medians are listed for this checkout.
It rewrites the "bootstrap" section of BENCHMARKS.md with the numbers, the machine and the load average.
The target it watches: a live bootstrap under 10 s on the 2-core box without a GPU; with GPUs the
micro-benchmarks add their own configured budget (preflight.bench).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.machine.runner import run_checks  # noqa: E402
from checks.probe.disk import measure_disks  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from checks.probe.nvml import read_nvml  # noqa: E402
from checks.probe.torch import SCRIPTS, read_torch  # noqa: E402
from checks.snapshot import load_snapshot  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:bootstrap:begin -->", "<!-- bench:bootstrap:end -->"
FIXTURES = ROOT / "tests" / "fixtures" / "machines"
REPLAYED = "tests/fixtures/machines/h100-sxm-8x-healthy.json"


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def invoke_bootstrap(tree: Path, *args: str) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds (user + system, of the process and the children it waited for) of one
    ``invoke bootstrap`` run in ``tree`` (a fresh HOME), and its JSON report."""
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_PREFLIGHT_")}
        env.update(HOME=home, NO_COLOR="1")
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "invoke", "bootstrap", *args, "--json", f"{home}/r.json"],
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        seconds = time.perf_counter() - t0
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = used.ru_utime - cpu.ru_utime + used.ru_stime - cpu.ru_stime
        report = Path(home, "r.json")
        return seconds, cpu_s, json.loads(report.read_text()) if report.exists() else {}


def replay_all() -> None:
    cfg = make_config()
    for path in sorted(FIXTURES.glob("*.json")):
        run_checks(load_snapshot(path)[0], cfg)


def disk_figures(beside_torch: bool) -> tuple[float, float, float]:
    """Cold read MB/s, small files/s and seconds of one disk measurement of a fresh HOME (its first location),
    alone or with the torch probe's child started beside it, as an overlapped bootstrap would."""
    with tempfile.TemporaryDirectory() as home:
        child = subprocess.Popen([sys.executable, str(SCRIPTS / "torch_facts.py")], stdout=subprocess.DEVNULL)
        if not beside_torch:
            child.wait()
        t0 = time.perf_counter()
        location = measure_disks(make_config().disk, home=home, tmp=home).locations[0]
        seconds = time.perf_counter() - t0
        child.wait()
    return location.cold_read_mb_s or 0.0, location.small_files_per_s or 0.0, seconds


def torch_libs_mib() -> float:
    """The size of torch's own shared libraries (torch/lib), what an import maps from the disk."""
    spec = importlib.util.find_spec("torch")
    lib = Path(spec.origin).parent / "lib" if spec and spec.origin else None
    return sum(f.stat().st_size for f in lib.iterdir() if f.is_file()) / 2**20 if lib and lib.is_dir() else 0.0


def overlap_rows(repeats: int) -> list[str]:
    """Why the measurements run alone: the disk figures with and without the torch child beside them."""
    runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(repeats):
        for beside in (False, True):
            runs[beside].append(disk_figures(beside))
    rows = ["| disk measurement | cold read MB/s | small files/s | seconds |", "|---|---|---|---|"]
    for beside, name in ((False, "alone (as bootstrap runs it)"), (True, "with the torch child started beside it")):
        read, small, secs = (statistics.median(r[i] for r in runs[beside]) for i in range(3))
        rows.append(f"| {name} | {read:,.0f} | {small:,.0f} | {secs:.2f} |")
    return rows


def machine_line() -> str:
    host = read_host()
    torch = read_torch()
    cpu = host.cpu_model or platform.processor() or "unknown CPU"
    ram = f"{(host.mem_total or 0) / 1024**3:.0f} GiB RAM"
    gpus = read_nvml()
    gpu = f"{len(gpus.gpus)} GPU(s)" if not gpus.error else "no GPU"
    return f"{cpu}, {host.cpu_affinity} usable cores, {ram}, {gpu}, Python {platform.python_version()}, torch {torch.version}"


class Runs:
    """Every timed run of the two trees, alternating, with the load average each started under."""

    def __init__(self, trees: dict[str, Path], repeats: int) -> None:
        self.trees, self.repeats = trees, repeats
        self.seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.cpu: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.phases: dict[str, list[float]] = defaultdict(list)
        self.inside: list[float] = []  # timing.seconds: bootstrap's own time, without Python's start-up
        self.loads: list[float] = []

    def run(self, row: str, *args: str) -> None:
        for _ in range(self.repeats):
            for name, tree in self.trees.items():
                self.loads.append(os.getloadavg()[0])
                seconds, cpu_s, report = invoke_bootstrap(tree, *args)
                self.seconds[(row, name)].append(seconds)
                self.cpu[(row, name)].append(cpu_s)
                timing = report.get("timing")
                if name == "after" and timing and timing["phases"]:
                    self.inside.append(timing["seconds"])
                    for phase, spent in _per_phase(timing["phases"]).items():
                        self.phases[phase].append(spent)

    def paired(self, row: str) -> str:
        """The median of after - before over the runs made one right after the other (the load changes slowly)."""
        pairs = zip(self.seconds[(row, "before")], self.seconds[(row, "after")], strict=True)
        return f"{statistics.median(after - before for before, after in pairs):+.2f}"

    def cell(self, row: str, name: str) -> str:
        times, cpu = self.seconds[(row, name)], self.cpu[(row, name)]
        return f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}), CPU {statistics.median(cpu):.2f}"


def _per_phase(phases: list[dict[str, Any]]) -> dict[str, float]:
    return {p["phase"]: p["seconds"] for p in phases}


def phase_rows(runs: Runs) -> list[str]:
    """Median seconds of each phase of bootstrap's own time over the live runs of this checkout."""
    rows = [f"| {phase} | {statistics.median(s):.3f} | {max(s):.3f} |" for phase, s in runs.phases.items()]
    inside = runs.inside or [0.0]
    rows.append(f"| bootstrap's own time (`timing.seconds`) | {statistics.median(inside):.3f} | {max(inside):.3f} |")
    return ["| phase (this checkout, live) | median seconds | max seconds |", "|---|---|---|", *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="an earlier commit to time side by side (git worktree)")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    after = f"this checkout ({head.stdout.strip()}{', with changes' if _dirty() else ''})"
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        trees = {"after": ROOT}
        if args.before:
            trees = {"before": Path(tmp) / "before", **trees}
            git = ["git", "worktree", "add", "--detach", "-q", str(trees["before"]), args.before]
            subprocess.run(git, cwd=ROOT, check=True)
        try:
            runs = Runs(trees, args.repeats)
            runs.run("`invoke bootstrap` live (no GPU: the benchmarks skip)")
            runs.run("`invoke bootstrap --machine <fixture>` replay", "--machine", REPLAYED)
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees["before"])], cwd=ROOT, check=False)
    names = list(trees)
    heads = {"before": f"before ({args.before})", "after": after}
    rows = list(dict.fromkeys(r for r, _ in runs.seconds))
    paired = "before" in trees
    table = [
        "| run | "
        + " | ".join(f"{heads[n]}: median wall s (min-max), median CPU s" for n in names)
        + (" | after - before, median of pairs |" if paired else " |"),
        "|---|" + "---|" * (len(names) + paired),
        *[
            f"| {row} | "
            + " | ".join(runs.cell(row, n) for n in names)
            + (f" | {runs.paired(row)} |" if paired else " |")
            for row in rows
        ],
    ]
    fixtures = len(list(FIXTURES.glob("*.json")))
    probes = [
        ("NVML read (read_nvml)", median_seconds(read_nvml, args.repeats)),
        ("host facts (read_host)", median_seconds(read_host, args.repeats)),
        ("torch probe child (read_torch)", median_seconds(read_torch, args.repeats)),
        (f"judge all {fixtures} fixtures (run_checks)", median_seconds(replay_all, args.repeats)),
    ]
    command = f"python tests/bench/bench_bootstrap.py --repeats {args.repeats}" + (
        f" --before {args.before}" if args.before else ""
    )
    section = "\n".join(
        [
            BEGIN,
            "## bootstrap",
            "",
            f"Machine: {machine_line()}.",
            "",
            f"`{command}`, run while other work shared the box: the 1-minute load average was"
            f" {min(runs.loads):.1f}-{max(runs.loads):.1f} at the runs' starts on 2 cores, so wall times spread; the",
            "CPU seconds (the process and its children) spread much less, and each row alternates between the trees",
            "run for run, so the median of the pairs' differences is the change. A run is the whole process (Python's",
            "start-up included); the phases are the JSON report's `timing` (bootstrap's own time, without the",
            "start-up). Target: a live bootstrap under 10 s here (2 cores, no GPU). Reading the machine overlaps: the torch",
            "child imports torch while a thread reads the host, the environment (packages, nvcc) and the topology.",
            "The measurements run alone: the last table is one disk location measured alone and with the torch",
            "child started beside it (medians of the same runs, alternating). Here torch's files sit in the page",
            f"cache; on a freshly rented box the import first reads its libraries ({torch_libs_mib():.0f} MiB in",
            "torch/lib for this build, a few GiB more with the CUDA wheels' nvidia-* libraries) from the disk that is",
            "being measured.",
            "",
            *table,
            "",
            *phase_rows(runs),
            "",
            "| step, in this process | median seconds |",
            "|---|---|",
            *[f"| {name} | {sec:.3f} |" for name, sec in probes],
            "",
            *overlap_rows(args.repeats),
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


def _dirty() -> bool:
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return bool(status.stdout.strip())


if __name__ == "__main__":
    main()
