"""Start the training child and watch it: one process, or every rank of a DDP run (parent side, no torch).

The training loop runs in its own processes, like every other torch call of the tool, so a hung CUDA call or a
wedged DataLoader worker cannot hang the task. One process (no DDP) is started here directly. The ranks of a DDP
run are started by torchrun (``python -m torch.distributed.run``, the engine users launch their own DDP with):
one torchrun per host with the static rendezvous on ``Node.addr:Node.port`` (on one box 127.0.0.1 and a free
port; across hosts rank 0's host), ``--node_rank`` the host's index, ``--nproc_per_node`` its ranks; each rank
reads its own spec file (``spec.${local_rank}.json``: torchrun fills in the macro) and joins the process group
through torchrun's store (``env://``). Each process gets its own events file and log (``rankN.log``: under
torchrun the child points its own output there).

The started process (the child, or torchrun) leads a process group apart from the task's (the terminal's Ctrl-C
does not reach it). torchrun starts every rank in a session of its own, so the end of a run kills the started
process's group and every rank's group, found as torchrun's children: no orphans, DataLoader workers included.

The watch loop tails the first rank's events for progress (``on_event``) and every rank's for news. It stops the
run when it exceeds its time limit (``timeout``) or no rank reported anything for ``stall_s`` (``stalled``,
naming the one rank that reported fewer events than the others); under DDP also when a rank exits with an error
or without a result (``crashed``, naming it: the others would only wait for it in the next all-reduce), or is
still running long after another ended cleanly (hung). Under torchrun the rank named is torchrun's own first
observed failure where it logged one (a rank that died before this loop saw it, or a peer torchrun stopped after
it, can be seen ended here first), else the first seen ended. Ctrl-C is forwarded as SIGINT to the started process (torchrun forwards it to
every rank), and the ranks stop after their step and write partial results.

Across hosts (``--hosts``) each host runs this for its own ranks (``Node``: the first global rank here, how many
run here, this host's index); the caller joins the hosts' results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from checks.probe.sample import children, process_exists, wait_gone
from checks.probe.tcp import free_port
from checks.verify.contract import (
    ChildResult,
    ChildRun,
    ContractError,
    Event,
    RankDevice,
    RankResult,
    RunSpec,
    parse_event,
)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "smoke_train.py"
INTERRUPT_GRACE_S = 20.0  # time a child gets to finish its step, read its CUDA events and write the result
FINISH_GRACE_S = 30.0  # a rank may end this much later than another that ended cleanly (teardown, slow save)
_POLL_S = 0.1
# torchrun's line when it sees a rank fail: "failed (exitcode: 1) local_rank: 1 (pid: ...) of binary: ..."
_FIRST_FAILURE = re.compile(r"failed \(exitcode: -?\d+\) local_rank: (\d+)")
TORCHRUN_MONITOR_S = 1.0  # torchrun's check of its ranks: slower than _POLL_S, so a failed rank is seen here first

__all__ = ["INTERRUPT_GRACE_S", "ChildRun", "Node", "launch"]


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


class _Tail:
    """Read the complete event lines appended to a file since the last call (a torn last line waits); a complete
    line that is not an event is counted out, with the first reason (``rejected``)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, ""
        self.count, self.rejected, self.reason = 0, 0, ""

    def read(self) -> list[Event]:
        try:
            with self.path.open(encoding="utf-8") as fh:
                fh.seek(self.offset)
                text = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return []
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(parse_event(line))
            except ContractError as exc:  # another producer's mistake: said in the log, never a reason to stop
                self.rejected += 1
                self.reason = self.reason or str(exc)
        self.count += len(out)
        return out


def child_env(extra_env: Mapping[str, str] | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """The training child's environment: ``extra_env`` under this one (a variable the user exported wins), and
    the names of ``extra_env`` that this environment already set."""
    extra = dict(extra_env or {})
    return {**extra, **os.environ, "PYTHONUNBUFFERED": "1"}, tuple(k for k in extra if k in os.environ)


def launch(
    spec: RunSpec,
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[Event], None] = lambda e: None,
    on_start: Callable[[int], None] = lambda pid: None,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
    node: Node | None = None,
) -> ChildRun:
    """Run ``spec``'s processes here: one without ``spec.ddp``, else ``ddp.world_size`` ranks (``node.local``
    of them with ``node``) under torchrun. Return the first one's result (None when it wrote none) and how the run
    ended; under DDP every local rank's figures are under the result's ``ranks``.

    ``extra_env`` (the allocator setting bootstrap writes for new shells) goes into every process's environment
    unless this environment sets the variable already: a value the user exported is what their run gets.
    """
    here = node or Node("127.0.0.1", free_port() if spec.ddp else 0, 0, spec.ddp.world_size if spec.ddp else 1)
    with tempfile.TemporaryDirectory(prefix="gpu-preflight-verify-") as tmp:
        work = Path(tmp)
        env, kept = child_env(extra_env)
        run = ChildRun(result=None, env_kept=kept)
        start = time.monotonic()
        tails = [_Tail(work / f"events.{r}.jsonl") for r in range(here.local)]
        for r in range(here.local):
            path = work / f"spec.{r}.json"
            path.write_text(json.dumps(_rank_spec(spec, here, r, work).to_json()), encoding="utf-8")
        started: subprocess.Popen[bytes] | None = None
        ranks: list[_Rank] = []
        try:
            if spec.ddp is None:
                started = _start([python, str(SCRIPT), str(work / "spec.0.json")], work, env, "rank0.log")
                ranks = [started]
            else:
                if spec.ddp.threads and "OMP_NUM_THREADS" not in env:  # else torchrun sets one thread a rank
                    env["OMP_NUM_THREADS"] = str(spec.ddp.threads)
                started = _start(_torchrun(python, here, work), work, env, "torchrun.log")
                group: list[_Worker] = []
                group += [_Worker(started, work, r, group) for r in range(here.local)]
                ranks = list(group)
            on_start(started.pid)
            _watch(started, ranks, tails, work, run, timeout_s, stall_s, on_event)
        finally:
            _kill_all(started, ranks)
        run.seconds = time.monotonic() - start
        for r, tail in enumerate(tails):
            _note(work, r, f"{tail.rejected} event line(s) were not events: {tail.reason}" if tail.rejected else "")
        results = [_read_result(work, r, note=True) for r in range(here.local)]
        logs = [_rank_log(work, r) for r in range(here.local)]
        combine(run, results, logs, here.first, distributed=spec.ddp is not None)
        return run


def _rank_spec(spec: RunSpec, node: Node, rank: int, work: Path) -> RunSpec:
    """Local rank ``rank``'s spec (global ``node.first + rank``): its files, and under DDP its rendezvous."""
    mine = dataclasses.replace(
        spec, events=str(work / f"events.{rank}.jsonl"), result=str(work / f"result.{rank}.json")
    )
    if spec.ddp is None:
        return mine
    ddp = dataclasses.replace(
        spec.ddp, rank=node.first + rank, local_rank=rank, addr=node.addr, port=node.port, nodes=node.nodes
    )
    return dataclasses.replace(mine, ddp=ddp)


def _torchrun(python: str, node: Node, work: Path) -> list[str]:
    """torchrun's command line for this host's ranks: the static rendezvous on ``node.addr:node.port`` (the
    global ranks it gives, the hosts' rank counts summed in host order, are the ones the specs carry), no
    restarts (a failed rank is the verdict), a monitor interval longer than ``_POLL_S``, its own files in the run's
    folder. The underscore
    spellings of the options are the ones every torchrun since 1.10 reads."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={node.nodes}",
        f"--node_rank={node.index}",
        f"--nproc_per_node={node.local}",
        f"--master_addr={node.addr}",
        f"--master_port={node.port}",
        "--max_restarts=0",
        f"--monitor_interval={TORCHRUN_MONITOR_S}",
        f"--log_dir={work / 'torchrun'}",  # its error files: in the run's folder (by default a tempdir it leaves)
        str(SCRIPT),
        str(work / "spec.${local_rank}.json"),
    ]


def _start(argv: list[str], work: Path, env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
    """Start ``argv`` in ``work``, leading a process group of its own, its output to ``log_name``."""
    # A new group in the task's session, not the terminal's foreground group: a Ctrl-C reaches the task alone,
    # which forwards it. Popen(process_group=) is 3.11+; on 3.10 the same setpgid runs in the child before exec.
    where: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": lambda: os.setpgid(0, 0)}
    )
    with (work / log_name).open("w", encoding="utf-8") as log:
        return subprocess.Popen(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, **where)


class _Rank(Protocol):
    def poll(self) -> int | None: ...


class _Worker:
    """A rank torchrun started, seen from here: found among torchrun's children by its spec file (the argument
    torchrun filled in), alive until its process is gone or a zombie. torchrun starts a host's ranks together,
    so a rank never seen ``START_SPREAD_S`` after a sibling was has already ended. ``poll`` answers as
    ``Popen.poll`` would: None while it runs, 0 once it ended with a clean result, 1 otherwise (torchrun, not this
    process, holds its exit status)."""

    START_SPREAD_S = 1.0

    def __init__(self, torchrun: subprocess.Popen[bytes], work: Path, local: int, group: list[_Worker]) -> None:
        self.torchrun, self.work, self.local, self.group = torchrun, work, local, group
        self.arg = str(work / f"spec.{local}.json")
        self.pid: int | None = None
        self.seen: float | None = None  # when its process was found
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        if self.pid is None:
            self.pid = next((pid for pid, argv in children(self.torchrun.pid) if self.arg in argv), None)
            self.seen = None if self.pid is None else time.monotonic()
        if self.pid is not None and process_exists(self.pid):
            return None
        first = min((w.seen for w in self.group if w.seen is not None), default=None)
        late = first is not None and time.monotonic() - first > self.START_SPREAD_S
        if self.pid is None and self.torchrun.poll() is None and not late:
            return None  # not started yet by a torchrun that still runs
        got = _read_result(self.work, self.local)
        self.code = 0 if got is not None and not got.error else 1
        return self.code


def _watch(
    started: subprocess.Popen[bytes],
    ranks: list[_Rank],
    tails: list[_Tail],
    work: Path,
    run: ChildRun,
    timeout_s: float,
    stall_s: float,
    on_event: Callable[[Event], None],
) -> None:
    """Poll every rank until all exit, a rank fails, the run times out or stalls, or Ctrl-C."""
    deadline, last_news = time.monotonic() + timeout_s, time.monotonic()
    first_clean: float | None = None
    try:
        while True:
            for r, tail in enumerate(tails):
                news = tail.read()
                last_news = time.monotonic() if news else last_news
                for event in news if r == 0 else ():
                    run.events.append(event)
                    on_event(event)
            codes = [p.poll() for p in ranks]
            now = time.monotonic()
            bad = [r for r, code in enumerate(codes) if code is not None and (code != 0 or _failed(work, r))]
            if bad and len(ranks) > 1:  # one rank here: its result (or none) says it all
                run.failure, run.rank = "crashed", _first_failed(started, ranks, bad, work)
                return
            if all(c is not None for c in codes):
                break
            first_clean = first_clean or (now if any(c is not None for c in codes) else None)
            hung = first_clean is not None and now - first_clean > FINISH_GRACE_S
            if now > deadline or now - last_news > stall_s or hung:
                run.failure = "timeout" if now > deadline else "stalled"
                run.rank = next(r for r, c in enumerate(codes) if c is None) if hung else _lagging(tails)
                return
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        run.interrupted = True
        _interrupt(started, ranks)
    run.events += tails[0].read()


def _failed(work: Path, rank: int) -> bool:
    got = _read_result(work, rank)
    return got is None or bool(got.error)


def _first_failed(started: subprocess.Popen[bytes], ranks: list[_Rank], bad: list[int], work: Path) -> int:
    """The rank that failed first, of ``bad`` (seen ended without a clean result). Under torchrun, torchrun's own
    first observed failure where it logged one: it holds the exit codes, and a rank it stopped after a peer's
    failure can be seen ended here first. Else the lowest of ``bad``."""
    if not isinstance(ranks[0], _Worker):
        return bad[0]
    with contextlib.suppress(subprocess.TimeoutExpired):
        started.wait(timeout=3 * TORCHRUN_MONITOR_S)  # it logs the failure, stops the others and ends
    found = _FIRST_FAILURE.search(_tail(work / "torchrun.log", 400))
    return int(found.group(1)) if found and int(found.group(1)) < len(ranks) else bad[0]


def _lagging(tails: list[_Tail]) -> int | None:
    """The one rank that reported fewer events than every other (None when no single rank lags, or one runs)."""
    counts = [t.count for t in tails]
    low = min(counts)
    return counts.index(low) if counts.count(low) == 1 and len(counts) > 1 else None


def _interrupt(started: subprocess.Popen[bytes], ranks: list[_Rank]) -> None:
    """Forward Ctrl-C to the started process (torchrun forwards it to every rank; their workers stop with them);
    the grace time or a second Ctrl-C ends the wait for the ranks."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(started.pid, signal.SIGINT)
    end = time.monotonic() + INTERRUPT_GRACE_S
    with contextlib.suppress(KeyboardInterrupt):
        while time.monotonic() < end and any(r.poll() is None for r in ranks):
            time.sleep(_POLL_S)
        started.wait(timeout=max(0.1, min(5.0, end - time.monotonic())))
    with contextlib.suppress(subprocess.TimeoutExpired):
        started.wait(timeout=0)


def _kill_all(started: subprocess.Popen[bytes] | None, ranks: list[_Rank]) -> None:
    """Kill the started process's group and, under torchrun, every rank's own group (each rank leads a session of
    its own, with its DataLoader and compile workers), reap the started process and wait (a few seconds at most)
    until the ranks, reaped by whoever inherits them, are gone: nothing of the run outlives the call."""
    if started is None:
        return
    workers = {r.pid for r in ranks if isinstance(r, _Worker) and r.pid is not None}
    workers |= {pid for pid, _ in children(started.pid)}
    for group in {started.pid, *workers}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    started.wait()
    wait_gone(workers, 5.0)


def combine(
    run: ChildRun, results: list[ChildResult | None], logs: list[str], first: int = 0, distributed: bool = True
) -> None:
    """Set ``run.result``: the first local rank's result (rank 0's on one box) stands for the run.

    One process: its result as it is. Under DDP every rank's steps and A/B figures go under ``ranks`` (global
    numbers from ``first``, each with its device); a failed rank's error and log replace rank 0's (whose own error
    is then only the lost peer). ``run.rank`` is made global. No result at all and no other reason: crashed.
    """
    failed = run.rank
    run.rank = None if failed is None else first + failed
    run.log_tail = logs[failed if failed is not None else 0]
    base = results[0] if results[0] is not None or failed is None else results[failed]
    if failed is not None:
        bad = results[failed]
        what = (bad.error if bad else None) or f"{run.failure}: exit without a result"
        base = dataclasses.replace(
            base or ChildResult(),
            error=f"rank {first + failed}: {what}",
            error_kind=(bad.error_kind if bad else None) or "crash",
        )
    if base is not None and run.interrupted:  # a rank whose peer stopped first fails its all-reduce: the Ctrl-C
        base = dataclasses.replace(base, interrupted=True, error=None, error_kind=None)
    if base is not None and distributed:
        ranks = tuple(_rank(first + r, res, r) for r, res in enumerate(results))
        base = dataclasses.replace(base, ranks=ranks)
    run.result = base
    if base is None and run.failure is None:
        run.failure = "crashed"


def _rank(rank: int, res: ChildResult | None, local: int) -> RankResult:
    """A rank's part: on a GPU its device index on its host (``ddp.start`` sets device ``local_rank``) and UUID."""
    if res is None:
        return RankResult(rank)
    d = res.device
    device = None if d is None else RankDevice(d.type, local if d.type == "cuda" else None, d.uuid)
    return RankResult(rank, res.steps, res.ddp, res.error, device)


def _read_result(work: Path, rank: int, note: bool = False) -> ChildResult | None:
    """Local rank ``rank``'s result as its record; None when absent, torn, or not a child result (with ``note``
    the rank's log then says why, as its last line)."""
    try:
        return ChildResult.from_json(json.loads((work / f"result.{rank}.json").read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        return None
    except ContractError as exc:
        _note(work, rank, f"result.{rank}.json is not a child result: {exc}" if note else "")
        return None


def _note(work: Path, rank: int, line: str) -> None:
    """Add verify's own ``line`` to the end of local rank ``rank``'s log (nothing when empty)."""
    if line:
        with contextlib.suppress(OSError), (work / f"rank{rank}.log").open("a", encoding="utf-8") as log:
            log.write(f"\nverify: {line}\n")


def _rank_log(work: Path, rank: int) -> str:
    """Local rank ``rank``'s last log lines; under torchrun, torchrun's own where the rank wrote none (it failed
    before the child could point its output at its log, or torchrun itself failed)."""
    own = _tail(work / f"rank{rank}.log")
    return own if own.strip() else _tail(work / "torchrun.log")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
