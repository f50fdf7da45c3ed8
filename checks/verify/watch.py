"""``invoke watch``: sample NVML and psutil while the user's own training runs, and judge GPU use against CPU use.

The seed article's first test (§1.2): nvidia-smi in one window, htop in the other, for a minute. GPU utilisation
low while CPU cores are saturated: the data pipeline (cpu-starved). Low with high iowait: reading the data
(data-bound). High: the GPU is busy, but NVML's utilisation is time-based and a tiny kernel fills it too
(docs/sources.md#nvml-utilization), so this is compute-bound with low confidence; ``invoke verify --model`` tells it
apart from launch-bound. Rules on coinciding samples follow SageMaker's CPUBottleneck (docs/sources.md#sagemaker-debugger-rules).

With ``--pid`` the watch ends when the process exits, and only the samples taken while it was alive are judged
(idle samples after it would dilute the medians). Every verdict's evidence carries what was sampled, the process
tree's CPU included, with or without NVML; a ``cant-tell`` is a warn, never a "ready to train".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checks.config import VerifyConfig
from checks.errors import PreflightError
from checks.probe.host import read_host
from checks.probe.sample import GpuReader, HostReader, process_exists, process_tree
from checks.result import Result, ok, skip, warn
from checks.verify.diagnosis import Verdict, contended, throttle_verdict
from checks.verify.sampler import Row, Sampler, Trace, busiest_gpu, gpu_summary, summarise

_POLL_S = 0.1  # how often --pid's process is checked for having exited
PROGRESS_EVERY_S = 1.0  # how often sample() hands its caller a progress line (the caller may show fewer)


@dataclass
class Watched:
    """The trace of one watch, the GPU judged, whether Ctrl-C ended it early, and when the watched process exited
    (seconds after the watch started; None while it lived through the watch)."""

    trace: Trace
    gpu: int | None
    gpu_error: str | None
    interrupted: bool
    pid: int | None
    exited_after_s: float | None = None


def usable_here() -> tuple[float, str]:
    """Usable cores of this machine (affinity and cgroup quota) and its hostname, without the torch probe."""
    host = read_host()
    return host.usable_cores, host.hostname


def check_pid(pid: int) -> None:
    """Refuse a PID that does not exist (exit 2) before sampling for a minute."""
    if pid and not process_exists(pid):
        raise PreflightError(f"no process {pid}", hint="give the PID of your training process (ps, nvidia-smi)")


def sample(
    seconds: float,
    pid: int | None,
    usable_cores: float,
    cfg: VerifyConfig,
    progress: Callable[[str], None] | None = None,
) -> Watched:
    """Sample for ``seconds``, or until process ``pid`` exits (Ctrl-C stops early and keeps what was sampled).

    ``progress`` gets a line about every ``PROGRESS_EVERY_S`` while it samples (what it has seen so far, the
    seconds left); the caller decides where, and how often, to show it."""
    gpu = GpuReader()
    interrupted, exited = False, None
    start = time.monotonic()
    with Sampler(cfg.sample_interval_s, gpu, HostReader(pid=pid, usable=usable_cores)) as sampler:
        owners = gpu.processes() if pid else {}
        tree = process_tree(pid) if pid else set()
        mine = sorted(i for i, pids in owners.items() if pids & tree)
        if mine:
            gpu.focus = set(mine)
        tick = _ticker(sampler.trace, start, seconds, mine[0] if mine else None, progress) if progress else None
        try:
            exited = _wait(start + seconds, pid, tick)
        except KeyboardInterrupt:
            interrupted = True
    trace = sampler.trace if exited is None else sampler.trace.within(start, exited)
    index = mine[0] if mine else busiest_gpu(trace)
    return Watched(trace, index, gpu.error, interrupted, pid, None if exited is None else exited - start)


def _wait(deadline: float, pid: int | None, tick: Callable[[float], None] | None = None) -> float | None:
    """Sleep until ``deadline``; return the monotonic time ``pid`` was seen gone, if it exits first."""
    while (left := deadline - time.monotonic()) > 0:
        if pid and not process_exists(pid):
            return time.monotonic()
        if tick is not None:
            tick(time.monotonic())
        time.sleep(min(_POLL_S, left))
    return None


def _ticker(
    trace: Trace, start: float, seconds: float, gpu: int | None, say: Callable[[str], None]
) -> Callable[[float], None]:
    """A ``tick(now)`` that passes ``say`` a progress line at most every ``PROGRESS_EVERY_S``."""
    last = [start]

    def tick(now: float) -> None:
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            say(progress_line(list(trace.rows), now - start, seconds, gpu))

    return tick


def progress_line(rows: list[Row], elapsed: float, seconds: float, gpu: int | None = None) -> str:
    """'watch: 12 of 60 s, 118 samples: GPU 0 busy 87%, CPU 45% (medians so far); 48 s left'."""
    seen = Trace(rows=rows)
    index = gpu if gpu is not None else busiest_gpu(seen)
    parts = []
    if index is not None and (util := seen.values(f"gpu{index}_util_pct")):
        parts.append(f"GPU {index} busy {statistics.median(util):.0f}%")
    else:
        parts.append("no GPU sampled")
    if cpu := seen.values("cpu_pct"):
        parts.append(f"CPU {statistics.median(cpu):.0f}%")
    if tree := seen.values("tree_cpu_cores"):
        parts.append(f"the process tree {statistics.median(tree):.1f} cores")
    left = max(0.0, seconds - elapsed)
    return f"watch: {elapsed:.0f} of {seconds:g} s, {len(rows)} samples: {', '.join(parts)} (medians so far); {left:.0f} s left"


def sampled(w: Watched, usable_cores: float) -> dict[str, Any]:
    """What the watch sampled, whatever the verdict: span, machine CPU, iowait, the process tree's CPU."""
    t = w.trace
    times = t.values("t_mono")
    tree = t.values("tree_cpu_cores")
    ev: dict[str, Any] = {
        "samples": len(t.rows),
        "seconds": round(times[-1] - times[0], 2) if len(times) > 1 else 0.0,
        "cpu_pct_p50": _p50(t.values("cpu_pct")),
        "iowait_p50": _p50(t.values("iowait_pct")),
    }
    if w.pid:
        ev |= {"pid": w.pid, "tree_cpu_cores_p50": _p50(tree), "tree_cpu_cores_max": max(tree, default=None)}
        ev |= {"tree_cpu_fraction_p50": None if not tree else round(statistics.median(tree) / usable_cores, 3)}
        ev |= {"workers_max": max(t.values("workers"), default=None), "ranks_max": max(t.values("ranks"), default=None)}
        ev["exited_after_s"] = w.exited_after_s
    return ev


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _cpu_saturated(row: Row, usable_cores: float, by_tree: bool, fraction: float) -> bool:
    tree = row.get("tree_cpu_cores")
    if by_tree and tree is not None:
        return tree / usable_cores >= fraction
    mean, top = row.get("cpu_pct"), row.get("cpu_max_core_pct")
    return (mean is not None and mean >= 100 * fraction) or (top is not None and top >= 100 * fraction)


def verdicts(w: Watched, cfg: VerifyConfig, usable_cores: float) -> list[Verdict]:
    """The GPU-utilisation-vs-CPU verdict, then near-oom and throttled when they apply; each with what was sampled."""
    host = sampled(w, usable_cores)
    return [*_gpu_verdicts(w, cfg, usable_cores, host), *_neighbour(host, cfg)]


def _neighbour(host: dict[str, Any], cfg: VerifyConfig) -> list[Verdict]:
    """cpu-contended: the machine's cores saturated while the watched process tree used under half of what was
    busy (verify's rule on the medians of the samples); only with --pid, which tells the tree apart."""
    busy, mine = host.get("cpu_pct_p50"), host.get("tree_cpu_fraction_p50")
    found = contended(None if busy is None else busy / 100, mine, cfg)
    return [found] if found is not None else []


def _gpu_verdicts(w: Watched, cfg: VerifyConfig, usable_cores: float, host: dict[str, Any]) -> list[Verdict]:
    if w.gpu is None:
        tree = host.get("tree_cpu_cores_p50")
        cpu = (
            f"; process {w.pid}'s tree used a median {tree:.2f} of {usable_cores:g} usable cores"
            if tree is not None
            else f"; the machine's CPU median {host['cpu_pct_p50'] or 0:.0f}%"
        )
        summary = f"no GPU sampled ({w.gpu_error or 'none visible'}): nothing to weigh the CPU against{cpu}"
        return [Verdict("cant-tell", "warn", "low", summary, "run watch on the GPU machine", 0.0, host)]
    col = f"gpu{w.gpu}_util_pct"
    rows = [r for r in w.trace.rows if r.get(col) is not None]
    if len(rows) < 2:
        return [
            Verdict("cant-tell", "warn", "low", "fewer than 2 GPU samples", "watch for longer (--seconds)", 0.0, host)
        ]
    g = gpu_summary(w.trace, w.gpu)
    util = statistics.median(float(r[col] or 0.0) for r in rows)
    low = [r for r in rows if (r[col] or 0.0) < cfg.gpu_util_low_pct]
    starved = sum(_cpu_saturated(r, usable_cores, w.pid is not None, cfg.cpu_saturated_fraction) for r in low) / len(
        rows
    )
    iowait = statistics.median(w.trace.values("iowait_pct") or [0.0])
    ev = host | {"gpu": w.gpu, "util_p50": util, "starved_sample_fraction": round(starved, 3), "iowait_p50": iowait}
    found = [_main(util, starved, iowait, cfg, ev)]
    total, used = g.get("mem_total_mib"), g.get("mem_used_mib_max")
    if total and used and used >= cfg.near_oom_fraction * total:
        found.append(Verdict("near-oom", "warn", "medium", f"GPU memory peaked at {used / total:.0%} of {total / 1024:.0f} GiB",
                             "bf16, activation checkpointing, or a smaller micro-batch with gradient accumulation", 0.0, host | {"mem_used_mib_max": used}))  # fmt: skip
    throttled = throttle_verdict(g, cfg)
    return found + ([throttled] if throttled else [])


def _main(util: float, starved: float, iowait: float, cfg: VerifyConfig, ev: dict[str, Any]) -> Verdict:
    gpu = f"GPU utilisation median {util:.0f}%"
    if starved >= cfg.starved_sample_fraction:
        summary = f"{gpu}; in {starved:.0%} of samples the GPU was under {cfg.gpu_util_low_pct:.0f}% while the CPU was saturated"
        fix = "the data pipeline is CPU-bound: pre-decode once (invoke stage-data), lighter augmentation, workers sized to the usable cores, more vCPUs per GPU"
        return Verdict("cpu-starved", "warn", "medium", summary, fix, starved, ev)
    if util < cfg.gpu_util_low_pct and iowait >= cfg.iowait_high_pct:
        fix = "reading the data is the limit: copy it to local NVMe or /dev/shm (invoke stage-data)"
        return Verdict("data-bound", "warn", "medium", f"{gpu} with iowait at {iowait:.0f}%", fix, 0.0, ev)
    if util >= cfg.gpu_util_busy_pct:
        summary = f"{gpu}: busy by NVML's time-based measure (a single tiny kernel also counts as busy)"
        fix = "if throughput is still low, many small kernels: try torch.compile; invoke verify --model MODULE:CALLABLE measures it"
        return Verdict("compute-bound", "info", "low", summary, fix, 0.0, ev)
    summary = f"{gpu} while the CPU is not saturated: the GPU waits on something else (I/O under the threshold, sync, eval, checkpoints, or no work)"
    return Verdict("cant-tell", "warn", "low", summary, "invoke verify times each phase of a step", 0.0, ev)


def results(w: Watched, found: list[Verdict], usable_cores: float, csv: str) -> tuple[list[Result], dict[str, Any]]:
    """``watch-sampler`` and ``diagnosis`` results, and the measurements for the JSON report."""
    summary = summarise(w.trace, w.gpu, usable_cores)
    m = {
        "sampler": summary | {"csv": csv},
        "diagnosis": {"verdict": found[0].id, "verdicts": [v.as_dict() for v in found]},
    }
    where = f"GPU {w.gpu}" if w.gpu is not None else f"no GPU ({w.gpu_error or 'none visible'})"
    who = f"process {w.pid} and its children" if w.pid else "the whole machine"
    line = f"{summary['samples']} samples over {summary['seconds']:.0f} s of {where} and {who}"
    if w.exited_after_s is not None:
        line += f" (it exited after {w.exited_after_s:.1f} s: judged over its life)"
    line += " (stopped early by Ctrl-C)" if w.interrupted else ""
    sampled_result = ok("watch-sampler", line, value=summary["samples"])
    if not w.trace.rows:
        return [sampled_result, skip("diagnosis", "nothing sampled")], m
    top = found[0]
    text = f"{top.id} ({top.confidence} confidence): {top.summary}"
    # cant-tell is a warn: the watch did not clear the run, so the call to action must not say it is ready.
    judged = (
        ok("diagnosis", text, value=top.id, hint=top.fix)
        if top.id == "compute-bound"
        else warn("diagnosis", text, top.fix, value=top.id)
    )
    return [sampled_result, judged], m
