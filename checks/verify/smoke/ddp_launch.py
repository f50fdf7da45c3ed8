"""Start one smoke child per rank and watch them together (parent side, no torch).

torchrun's static rendezvous, kept small: every rank gets its own spec (rank, world size, and the TCP store rank
0 hosts: on one box a free port of 127.0.0.1; across hosts the ``Node`` the caller gives, rank 0's host address
and a port), its own events file and log. Across hosts each host runs this for its own ranks (``Node``: the
first global rank here and how many run here); the caller joins the hosts' results. All ranks share one process
group, led by rank 0 and apart from the task's (the terminal's Ctrl-C does not reach it), so one ``killpg`` ends every rank and its DataLoader workers: no
orphans. A rank that exits with an error (or without a result) stops the run at once, as the others would only
wait for it in the next all-reduce; a rank still running long after another ended cleanly is hung. Ctrl-C goes to
every rank, which stop after their step and write partial results.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.probe.tcp import free_port
from checks.verify.smoke.launch import INTERRUPT_GRACE_S, SCRIPT, ChildRun, _read_json, _Tail, _tail, child_env

_POLL_S = 0.1
FINISH_GRACE_S = 30.0  # a rank may end this much later than another that ended cleanly (teardown, slow save)


@dataclass(frozen=True)
class Node:
    """This host's part of a rendezvous: the store at ``addr:port`` (rank 0's host), ranks ``first`` to
    ``first + local - 1`` started here, ``index`` of ``nodes`` hosts."""

    addr: str
    port: int
    first: int
    local: int
    index: int = 0
    nodes: int = 1


def run_ddp(
    spec: dict[str, Any],
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda e: None,
    on_start: Callable[[int], None] = lambda pid: None,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
    node: Node | None = None,
) -> ChildRun:
    """Run this host's ranks (all ``spec["ddp"]["world_size"]`` of them without ``node``); return the first
    one's result (rank 0's on one box) with every local rank's figures under ``ranks``.

    Every rank gets ``extra_env`` as ``run_smoke``'s child does (``child_env``)."""
    world = int(spec["ddp"]["world_size"])
    here = node or Node("127.0.0.1", free_port("127.0.0.1"), 0, world)
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-ddp-") as tmp:
        work = Path(tmp)
        start = time.monotonic()
        env, kept = child_env(extra_env)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for r in range(here.local):
                procs.append(_spawn(spec, here, r, work, python, env, procs[0].pid if procs else None))
            on_start(procs[0].pid)
            run = ChildRun(result=None, env_kept=kept)
            _watch(
                procs,
                [_Tail(work / f"events.{r}.jsonl") for r in range(here.local)],
                work,
                run,
                timeout_s,
                stall_s,
                on_event,
            )
        finally:
            _kill_group(procs)
        run.seconds = time.monotonic() - start
        results = [_read_json(work / f"result.{r}.json") for r in range(here.local)]
        logs = [_tail(work / f"rank{r}.log") for r in range(here.local)]
        combine(run, results, logs, here.first)
        return run


def _spawn(
    spec: dict[str, Any], node: Node, rank: int, work: Path, python: str, env: dict[str, str], group: int | None
) -> subprocess.Popen[bytes]:
    """Start local rank ``rank`` (global ``node.first + rank``)."""
    ddp = {**spec["ddp"], "rank": node.first + rank, "local_rank": rank, "addr": node.addr, "port": node.port}
    ddp |= {"nodes": node.nodes}
    mine = {
        **spec,
        "ddp": ddp,
        "events": str(work / f"events.{rank}.jsonl"),
        "result": str(work / f"result.{rank}.json"),
    }
    path = work / f"spec.{rank}.json"
    path.write_text(json.dumps(mine), encoding="utf-8")
    # One group led by rank 0, in the task's session (setpgid cannot join a group of another session); not the
    # terminal's foreground group, so a Ctrl-C reaches the task alone, which forwards it.
    pgid = 0 if group is None else group
    # Popen(process_group=) is 3.11+; on 3.10 the same setpgid runs in the child before exec.
    where: dict[str, Any] = (
        {"process_group": pgid} if sys.version_info >= (3, 11) else {"preexec_fn": lambda: os.setpgid(0, pgid)}
    )
    with (work / f"rank{rank}.log").open("w", encoding="utf-8") as log:
        return subprocess.Popen(
            [python, str(SCRIPT), str(path)], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, **where
        )


def _watch(
    procs: list[subprocess.Popen[bytes]],
    tails: list[_Tail],
    work: Path,
    run: ChildRun,
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[dict[str, Any]], None],
) -> None:
    """Poll every rank until all exit, one fails, the run times out or stalls, or Ctrl-C."""
    deadline, last_news, counts = time.monotonic() + timeout_s, time.monotonic(), [0] * len(procs)
    first_clean: float | None = None
    try:
        while True:
            for r, tail in enumerate(tails):
                news = tail.read()
                counts[r] += len(news)
                last_news = time.monotonic() if news else last_news
                for event in news if r == 0 else ():
                    run.events.append(event)
                    on_event(event)
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return
            now = time.monotonic()
            for r, code in enumerate(codes):
                if code is None:
                    continue
                got = _read_json(work / f"result.{r}.json")
                if code != 0 or got is None or got.get("error"):
                    run.failure, run.rank = "crashed", r
                    return
                first_clean = first_clean or now
            hung = first_clean is not None and now - first_clean > FINISH_GRACE_S
            if now > deadline or now - last_news > stall_s or hung:
                run.failure = "timeout" if now > deadline else "stalled"
                run.rank = next(r for r, c in enumerate(codes) if c is None) if hung else _lagging(counts)
                return
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        run.interrupted = True
        _interrupt(procs)


def _lagging(counts: list[int]) -> int | None:
    """The one rank that reported fewer events than every other (None when no single rank lags)."""
    low = min(counts)
    return counts.index(low) if counts.count(low) == 1 and len(counts) > 1 else None


def _interrupt(procs: list[subprocess.Popen[bytes]]) -> None:
    """Forward Ctrl-C to every rank; the grace time (or a second Ctrl-C) ends the wait."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGINT)
    end = time.monotonic() + INTERRUPT_GRACE_S
    with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
        for p in procs:
            p.wait(timeout=max(0.1, end - time.monotonic()))


def _kill_group(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill the ranks' process group (every rank and its workers), then reap the ranks."""
    if not procs:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(procs[0].pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def combine(run: ChildRun, results: list[dict[str, Any] | None], logs: list[str], first: int = 0) -> None:
    """The first local rank's result (rank 0's on one box) stands for the run; every rank's steps and A/B figures
    go under ``ranks`` (global numbers from ``first``, each with its device); a failed rank's error and log replace rank 0's (whose own
    error is then only the lost peer). ``run.rank`` is made global."""
    failed = run.rank
    run.rank = None if failed is None else first + failed
    base = dict(results[0] or {}) if results[0] or failed is None else dict(results[failed] or {})
    run.log_tail = logs[failed if failed is not None else 0]
    if failed is not None:
        bad = results[failed] or {}
        what = bad.get("error") or f"{run.failure}: exit without a result"
        base.update(error=f"rank {first + failed}: {what}", error_kind=bad.get("error_kind") or "crash")
    if not base:
        run.result = None
        return
    if run.interrupted:  # a rank whose peer stopped first fails its all-reduce: that is the Ctrl-C, not a fault
        base.update(interrupted=True, error=None, error_kind=None)
    base["ranks"] = [
        {
            "rank": first + r,
            "steps": (res or {}).get("steps") or [],
            "ddp": (res or {}).get("ddp"),
            "error": (res or {}).get("error"),
            "device": _device(res, r),
        }
        for r, res in enumerate(results)
    ]
    run.result = base


def _device(res: dict[str, Any] | None, local: int) -> dict[str, Any] | None:
    """A rank's device: on a GPU its index on its host (``ddp.start`` sets device ``local_rank``) and UUID."""
    d = (res or {}).get("device")
    if not d:
        return None
    return {"type": d.get("type"), "index": local if d.get("type") == "cuda" else None, "uuid": d.get("uuid")}
