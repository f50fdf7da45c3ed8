"""Benchmark: the built-in disk and TCP measurements against fio and iperf3, and bootstrap fan-out, in one run.

Run from the repository root, as root (network namespaces, tc):  python tests/bench/bench_disk_net.py [--repeats N]
It rewrites the "disk and network" section of BENCHMARKS.md with the numbers and the machine they ran on.

Targets: built-in sequential write and cold read within ±10% of fio on the same file size, block
size, sync interval and location; built-in TCP within ±10% of iperf3 over the same tc-shaped namespace link,
and both within ±10% of the shaped rate; ``invoke bootstrap --hosts`` over 4 namespace hosts in at most 1.3x
the time of one host. Runs are interleaved (A, B, A, B, ...) so that drift hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.probe.diskio import cold_read, seq_write  # noqa: E402
from checks.probe.fio import fio_sequential  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from checks.probe.mounts import mount_of, read_mounts  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402
from tests.netns import Cluster, cluster, python_for_hosts, unavailable  # noqa: E402

BEGIN, END = "<!-- bench:disknet:begin -->", "<!-- bench:disknet:end -->"
MIB = 1024**2
DISK_MIB, SYNC_MIB = 1024, 64
RATES = (500, 2000)


def ratio_row(name: str, ours: list[float], theirs: list[float], unit: str, target: float = 0.10) -> str:
    a, b = statistics.median(ours), statistics.median(theirs)
    verdict = "met" if abs(a / b - 1) <= target else "**missed**"
    return f"| {name} | {a:,.0f} | {b:,.0f} | {unit} | {a / b:.2f} | {verdict} |"


# --- disk ---------------------------------------------------------------------------------------------------


def builtin_disk(directory: str) -> tuple[float, float]:
    path = os.path.join(directory, "builtin.bin")
    written, spent = seq_write(path, DISK_MIB * MIB, float("inf"), SYNC_MIB * MIB)
    read, read_s, _ = cold_read(path, float("inf"))
    os.unlink(path)
    return written / spent / 1e6, read / read_s / 1e6


def fio_disk(directory: str) -> tuple[float, float]:
    found = fio_sequential(directory, DISK_MIB * MIB, SYNC_MIB // 4, 600.0, 600.0)
    if found is None:
        raise RuntimeError("fio failed")
    return float(found["seq_write_mb_s"]), float(found["cold_read_mb_s"])  # type: ignore[arg-type]


def bench_disk(repeats: int) -> list[str]:
    if shutil.which("fio") is None:
        return ["fio is not installed: no disk comparison (apt-get install fio)."]
    directory = tempfile.mkdtemp(prefix="gpu-preflight-bench-")
    try:
        runs: dict[str, list[tuple[float, float]]] = {"builtin": [], "fio": []}
        for i in range(2 * repeats + 1):  # this VM's disk is noisy: more runs than the other sections
            order = [("builtin", builtin_disk), ("fio", fio_disk)][:: 1 if i % 2 == 0 else -1]
            for name, fn in order:
                runs[name].append(fn(directory))
        mount = mount_of(directory, read_mounts())
        where = f"{directory.rsplit('/', 1)[0]} ({mount.fs_type} on {mount.source})" if mount else directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ours, fio = runs["builtin"], runs["fio"]
    return [
        f"A {DISK_MIB} MiB file in {where}, 4 MiB writes with an fdatasync every {SYNC_MIB} MiB and a final fsync, "
        f"then read back after posix_fadvise(DONTNEED); median of {2 * repeats + 1} runs each, interleaved.",
        "",
        "| figure | built-in | fio | unit | built-in / fio | ±10% |",
        "|---|---|---|---|---|---|",
        ratio_row("sequential write, fsynced", [w for w, _ in ours], [w for w, _ in fio], "MB/s"),
        ratio_row("cold sequential read", [r for _, r in ours], [r for _, r in fio], "MB/s"),
        "",
        "Each run, MB/s (write / read): built-in "
        + ", ".join(f"{w:.0f}/{r:.0f}" for w, r in ours)
        + "; fio "
        + ", ".join(f"{w:.0f}/{r:.0f}" for w, r in fio)
        + ".",
    ]


# --- network ------------------------------------------------------------------------------------------------


def in_ns(netns: str, *argv: str, timeout: float = 120) -> dict[str, object]:
    out = subprocess.run(["ip", "netns", "exec", netns, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, check=False)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def bench_link(c: Cluster, rate: int, repeats: int) -> list[str]:
    a, b = c.hosts[0], c.hosts[1]
    for host in (a, b):
        c.shape(host, rate)
    server = subprocess.Popen(["ip", "netns", "exec", a.netns, sys.executable, "-m", "checks.probe.tcp", "serve",
                               "--bind", a.address, "--iperf3-port", "5201", "--idle", "300"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        common = ["--streams", "4", "--seconds", "3", "--omit", "1"]
        py = [sys.executable, "-m", "checks.probe.tcp"]
        ours: list[float] = []
        iperf: list[float] = []
        for i in range(repeats):
            for reverse in ([], ["--reverse"]):
                builtin = [*py, "client", a.address, str(info["port"]), *common, *reverse]
                with_iperf = [*py, "iperf3", a.address, str(info["iperf3_port"]), *common, *reverse]
                for sink, argv in [(ours, builtin), (iperf, with_iperf)][:: 1 if i % 2 == 0 else -1]:
                    sink.append(float(in_ns(b.netns, *argv)["mbit_s"]))  # type: ignore[arg-type]
    finally:
        server.terminate()
        server.wait(10)
    shaped_row = (
        f"| {rate} Mbit/s link: built-in / shaped, iperf3 / shaped | {statistics.median(ours) / rate:.2f} | "
        f"{statistics.median(iperf) / rate:.2f} | | | "
        f"{'met' if all(abs(statistics.median(x) / rate - 1) <= 0.10 for x in (ours, iperf)) else '**missed**'} |"
    )
    return [ratio_row(f"TCP over a {rate} Mbit/s tbf link", ours, iperf, "Mbit/s"), shaped_row]


def bench_network(repeats: int) -> list[str]:
    rows = ["| figure | built-in | iperf3 | unit | built-in / iperf3 | ±10% |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-bench-") as tmp, cluster(Path(tmp), [None, None]) as c:
        for rate in RATES:
            rows += bench_link(c, rate, repeats)
    return [
        "Two network namespaces on a bridge, both veth ends of each shaped with `tc tbf` at the same rate; 4 TCP",
        f"streams, 3 s measured after 1 s omitted, both directions; median of {2 * repeats} runs each, interleaved.",
        "The shaped rate counts Ethernet and IP headers, so TCP payload tops out near 0.95 of it.",
        "",
        *rows,
    ]


# --- fan-out ------------------------------------------------------------------------------------------------


FANOUT_CONFIG = """preflight:
  network: {{links: false, allreduce: false}}
  disk: {{enabled: {disk}}}
  hosts: {{python: {python}}}
"""


def stub_python(path: Path) -> str:
    """A "Python" for the hosts that runs everything for real except bootstrap, which it answers at once."""
    path.write_text(
        '#!/bin/sh\ncase " $* " in *" -m invoke "*)\n'
        '  while [ $# -gt 0 ]; do [ "$1" = "--json" ] && out="$2"; shift; done\n'
        '  echo \'{"schema": 1, "results": [], "measurements": {}}\' > "$out"; exit 0 ;;\nesac\n'
        f'exec {python_for_hosts()} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def local_cpu_seconds(cfg: Path, env: dict[str, str]) -> float:
    """User + system CPU seconds of one local bootstrap with the same config, its children included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as home:
        argv = [sys.executable, "-m", "invoke", "-f", str(cfg), "bootstrap"]
        subprocess.run(argv, cwd=ROOT, env={**env, "HOME": home}, capture_output=True, timeout=600, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def time_fanout(cfg: Path, env: dict[str, str], repeats: int) -> tuple[float, float]:
    """Median seconds of `bootstrap --hosts h1` and of `--hosts h1,h2,h3,h4`, interleaved."""
    times: dict[str, list[float]] = {"h1": [], "h1,h2,h3,h4": []}
    for i in range(repeats + 1):  # the first round ships the checkout: not counted
        for hosts in list(times)[:: 1 if i % 2 == 0 else -1]:
            argv = [sys.executable, "-m", "invoke", "-f", str(cfg), "bootstrap", "--hosts", hosts]
            start = time.monotonic()
            subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=600, check=False)
            if i:
                times[hosts].append(time.monotonic() - start)
    one, four = (statistics.median(v) for v in times.values())
    return one, four


def bench_fanout(repeats: int) -> list[str]:
    rows = [
        "| remote bootstrap | 1 host, s | 4 hosts, s | 4 / 1 | ≤ 1.3x | CPU s per bootstrap | 4-host floor, s |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-bench-") as tmp, cluster(Path(tmp) / "h", [None] * 4) as c:
        home = Path(tmp) / "ctl"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(c.ssh_config())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_PREFLIGHT_", "SSH_AUTH_SOCK"))}
        env.update(HOME=str(home), NO_COLOR="1")
        stub = stub_python(home / "stub-python")
        variants = [(True, python_for_hosts(), "full (disks measured, default budget)"),
                    (False, python_for_hosts(), "without disk measurements"),
                    (False, stub, "orchestration only: a stub that writes an empty report")]  # fmt: skip
        for disk, python, label in variants:
            cfg = home / f"cfg-{len(rows)}.yaml"
            cfg.write_text(FANOUT_CONFIG.format(disk=str(disk).lower(), python=python))
            one, four = time_fanout(cfg, env, repeats)
            cpu = local_cpu_seconds(cfg, env) if python != stub else 0.0
            floor = max(one, 4 * cpu / (os.cpu_count() or 1))
            verdict = "met" if four <= 1.3 * one else "**missed**"
            rows.append(
                f"| {label} | {one:.1f} | {four:.1f} | {four / one:.2f} | {verdict} | {cpu:.1f} | {floor:.1f} |"
            )
    return [
        f"`invoke bootstrap --hosts` (links and all-reduce off: bootstrap fan-out only), median of {repeats} runs",
        "each after one warm-up run. The namespace hosts share this machine's CPUs and disk, so four hosts",
        "compete for them; separate machines would not. The floor is what four bootstraps cost on these cores",
        "even with free orchestration: max(one host's time, 4 x one bootstrap's CPU seconds / cores). The stub row",
        "isolates what the fan-out itself adds (connect, check Python, copy the checkout, run, read the report back):",
        "that is the part that carries over to separate machines, where each host has its own cores and disk.",
        "",
        *rows,
    ]


def machine_line() -> str:
    host = read_host()
    return (f"{host.cpu_model or platform.processor()}, {host.cpu_affinity} usable cores, "
            f"{(host.mem_total or 0) / 1024**3:.0f} GiB RAM, Python {platform.python_version()}, kernel {platform.release()}")  # fmt: skip


def tool_versions() -> str:
    fio = subprocess.run(["fio", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    iperf = subprocess.run(["iperf3", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    return f"{fio or 'no fio'}, {iperf or 'no iperf3'}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    why = unavailable()
    sections = [
        "### Disk: built-in vs fio",
        "",
        *bench_disk(repeats),
        "",
        "### Network: built-in TCP vs iperf3",
        "",
        *(bench_network(repeats) if why is None else [f"not run: {why}"]),
        "",
        "### Fan-out: bootstrap over 4 hosts vs 1",
        "",
        *(bench_fanout(max(1, repeats // 2)) if why is None else [f"not run: {why}"]),
    ]
    command = f"`python tests/bench/bench_disk_net.py --repeats {repeats}`"
    head = [BEGIN, "## disk and network", "", f"Machine: {machine_line()}; {tool_versions()}. {command}.", ""]
    section = "\n".join([*head, *sections, END])
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
