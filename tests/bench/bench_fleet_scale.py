"""Benchmark: the job-wide bootstrap at scale — the fleet report over 1,000 node records, and the
gather of a simulated 64-node job.

Run from the repository root:  python tests/bench/bench_fleet_scale.py [--records 1000] [--nodes 64]
It rewrites the "fleet-scale" section of BENCHMARKS.md.

1. Report: ``--records`` node records, each this machine's real bootstrap report (one ``invoke bootstrap --json``
   run here first) with its figures varied per node (disk speed, matmul, a few nodes' open-files limit), through
   ``build_fleet_report`` and ``render_fleet`` as rank 0 runs them; the median of 3 timings each. Target: under 1 s.
2. Gather: ``--nodes`` processes on this box, each the child a node runs (``checks/probe/scripts/job_gather.py``:
   torch's TCPStore on loopback, rank 0 hosting it), each sending that report; the wall time from the first start
   to rank 0's answer, and rank 0's own wait once it is up. torch's import in every child dominates on a small box.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.facts import FleetFacts, HostOutcome  # noqa: E402
from checks.fleet.render import render_fleet  # noqa: E402
from checks.fleet.report import build_fleet_report  # noqa: E402
from checks.result import Report  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:fleet-scale:begin -->", "<!-- bench:fleet-scale:end -->"
GATHER = ROOT / "checks" / "probe" / "scripts" / "job_gather.py"


def one_report(tmp: Path) -> dict:
    out = tmp / "node.json"
    env = os.environ | {"HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache")}
    subprocess.run([sys.executable, "-m", "invoke", "bootstrap", "--json", str(out)], cwd=ROOT, env=env,
                   capture_output=True, check=False, timeout=600)  # fmt: skip
    return json.loads(out.read_text(encoding="utf-8"))


def varied(report: dict, i: int) -> dict:
    """Node i's copy: its disk figures and open-files limit differ, so outliers and drift have work to do."""
    r = copy.deepcopy(report)
    for row in r.get("results", []):
        if row.get("id") == "ulimits" and isinstance(row.get("value"), dict) and i % 97 == 0:
            row["value"]["nofile"] = 1024
            row["status"] = "warn"
    disks = (r.get("measurements") or {}).get("disks") or {}
    for figures in disks.values() if isinstance(disks, dict) else []:
        if isinstance(figures, dict):
            for key, value in list(figures.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    figures[key] = value * (0.5 if i % 50 == 0 else 1.0 + (i % 7) / 100)
    return r


def time_report(report: dict, records: int) -> dict[str, float]:
    hosts = tuple(
        HostOutcome(f"gpu-{i:04d}", "ok", None, Report.from_json(varied(report, i)), 30.0, 0) for i in range(records)
    )
    facts = FleetFacts(hosts=hosts, source="bench")
    cfg = make_config({})
    build, render = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        fleet = build_fleet_report(facts, cfg, "gpu-0000")
        t1 = time.perf_counter()
        text = render_fleet(fleet)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        render.append(t2 - t1)
    return {"build": statistics.median(build), "render": statistics.median(render), "lines": text.count("\n")}


def time_gather(report: dict, nodes: int, tmp: Path) -> dict[str, float]:
    record = tmp / "record.json"
    record.write_text(json.dumps({"node": "n", "report": report, "seconds": 1.0}), encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    began = time.monotonic()
    for rank in range(nodes):
        args = {"addr": "127.0.0.1", "port": port, "rank": rank, "world": nodes, "host_store": rank == 0,
                "prefix": "bench", "node": rank, "record": str(record), "nodes": nodes, "wait_s": 600}  # fmt: skip
        argv = [sys.executable, str(GATHER), json.dumps(args)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    out = procs[0].communicate(timeout=900)[0]
    wall = time.monotonic() - began
    for p in procs[1:]:
        p.wait(timeout=120)
    got = json.loads(out.strip().splitlines()[-1])
    if got["missing"]:
        raise SystemExit(f"gather lost nodes {got['missing']}")
    return {
        "wall": wall,
        "rank0": float(got["seconds"]),
        "records": len(got["records"]),
        "bytes": record.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        report = one_report(Path(tmp))
        rep = time_report(report, args.records)
        gather = time_gather(report, args.nodes, Path(tmp))
    cores = len(os.sched_getaffinity(0))
    lines = [
        BEGIN,
        "## fleet scale (bootstrap in a job: the report and the gather)",
        "",
        "`python tests/bench/bench_fleet_scale.py`: rank 0's fleet report over node records that are this machine's "
        "real bootstrap report with per-node variations (median of 3), and the gather of a simulated job: one "
        "`job_gather.py` child per node on this box, each sending that report through torch's TCPStore on loopback. "
        "Target: the 1,000-record report under 1 s.",
        "",
        "| what | figure |",
        "|---|---|",
        f"| fleet report over {args.records:,} records: build | {rep['build']:.3f} s |",
        f"| same: render as text ({rep['lines']:,} lines) | {rep['render']:.3f} s |",
        f"| gather of {args.nodes} nodes ({gather['bytes'] / 1e3:.0f} kB record each): first start to rank 0's answer "
        f"| {gather['wall']:.1f} s |",
        f"| same: rank 0's own time in the store (connect, wait for every record, read them) | {gather['rank0']:.1f} s |",
        "",
        f"All {gather['records']} records arrived. The wall time is mostly {args.nodes} torch imports sharing "
        f"{cores} cores; on a real job each node imports torch on its own cores.",
        "",
        f"Machine: {platform.machine()}, {cores} usable cores, Python {platform.python_version()}; load average "
        f"{os.getloadavg()[0]:.1f} at the end.",
        END,
    ]
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
