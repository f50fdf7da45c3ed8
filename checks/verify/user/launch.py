"""Run the user's own command under the agent and stop it by the rules (parent side, no torch).

The command runs as given, in the user's folder and environment, plus: a temporary folder first on
``PYTHONPATH`` holding the start-up file and the agent (``inject/``), ``GPU_PREFLIGHT_EVENTS`` naming the folder
the agent writes its JSON lines to, and ``GPU_PREFLIGHT_LOADER`` when DataLoader settings are overridden.

It starts in a session of its own. Once every rank has done ``warmup + steps`` optimizer steps (or ``seconds``
have passed since the first measured one), verify stops it: SIGINT to its process group, SIGTERM after
``INT_GRACE_S``, SIGKILL after ``TERM_GRACE_S`` more; a script that asks the agent's ``should_stop()`` is asked
first (``_ask``: the stop file) and gets ``ASK_GRACE_S`` to end itself. torchrun starts each rank in a session
of its own and forwards the signal to them; DataLoader workers go with their process. Whatever is still alive afterwards
(ranks a killed torchrun orphaned, a crashed script's workers) is killed by process id: verify makes itself a
child subreaper, so orphans become its children and it can find them. The start, the signals and the kill by id
are ``checks.probe.session``'s, the launcher of every child the tool starts.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from checks.probe import session
from checks.probe.sample import process_tree
from checks.probe.session import Reaper
from checks.verify.contract import StopSpec
from checks.verify.events import Event, Hello, StepLine, Waiting, parse_line
from checks.verify.stop import MIN_MEASURED, rows_of, stable

INJECT = Path(__file__).resolve().parent / "inject"
EVENTS_ENV = "GPU_PREFLIGHT_EVENTS"
LOADER_ENV = "GPU_PREFLIGHT_LOADER"
COUNT_ENV = "GPU_PREFLIGHT_COUNT_STEP"
PEAK_ENV = "GPU_PREFLIGHT_PEAK"
MODEL_ENV = "GPU_PREFLIGHT_MODEL"
DDP_ENV = "GPU_PREFLIGHT_DDP"
PROFILE_ENV = "GPU_PREFLIGHT_PROFILE_STEP"
SPLIT_ENV = "GPU_PREFLIGHT_SPLIT"
# The measured run times each step of the dataset's transforms in every SPLIT_EVERY-th batch a process fetches (the
# agent's ``_Split``: a timing wrapper per transform call, on a sample of batches to keep its cost small).
SPLIT_EVERY = 3
# A script that asks should_stop() (the agent's) is asked first: the stop file, then this long to leave its loop
# and end as it would (its own save and exit: what a SIGINT gives it, INT_GRACE_S, plus the steps asked for ahead)
# before the signals. Tool-defined.
ASK_GRACE_S = 10.0
# Under torchrun the ranks must leave their loops at one step: verify asks for a step count this far ahead of the
# ranks at its pace (its view of them lags the agent's batched writes, 0.2 s, and its own poll, 0.1 s; each rank
# reads the file every 0.05 s: checks/verify/user/inject/_gpu_preflight_agent.py, FLUSH_S and STOP_READ_S).
ASK_LAG_S = 0.5
ASKED_WHEN = ("stopped", "limit")  # the endings a script that listens is asked for: it was stepping
INT_GRACE_S = 10.0  # SIGINT -> SIGTERM: time for the script's own teardown (torchrun closes its ranks). Tool-defined.
TERM_GRACE_S = 5.0  # SIGTERM -> SIGKILL. Tool-defined.
TREE_EVERY_S = 0.5  # how often the process tree is read (its members are killed by id at the end)
_POLL_S = 0.1


@dataclass(frozen=True)
class StopRule:
    """When verify stops the command: after ``warmup + steps`` steps on every rank, or ``seconds`` measured."""

    warmup: int
    steps: int
    seconds: float = 0.0  # > 0: measure for this long instead of ``steps``
    first_step_s: float = 900.0  # no optimizer step by then: stop and say so
    stall_s: float = 300.0  # no step for this long once steps have started
    limit_s: float = 0.0  # > 0: stop after this long whatever happened (the advice re-runs' budget)
    # The stop rule of checks/verify/stop.py (None: ``steps`` or ``seconds`` exactly): one process stops once its
    # shares are stable; any run once ``stop.deadline`` (monotonic) has passed and every rank measured MIN_MEASURED.
    stop: StopSpec | None = None


@dataclass
class CommandRun:
    """How the command went: its events (the agent's lines, parsed: ``checks.verify.events``), its exit, who
    ended it and what was left; ``dropped``: lines of an unknown kind or broken, kept out."""

    argv: tuple[str, ...]
    events: list[Event] = field(default_factory=list)
    dropped: int = 0
    returncode: int | None = None
    ended: str = ""  # stopped | exited | crashed | interrupted | no-step | stalled | limit | no-torch
    stop_reason: str = ""  # when stopped: steps | seconds | stable | budget (checks/verify/stop.py)
    stopped_by_verify: bool = False
    interrupted: bool = False
    signals: list[str] = field(default_factory=list)
    asked: bool = False  # asked to stop (should_stop()), before any signal
    stderr_tail: list[str] = field(default_factory=list)
    seconds: float = 0.0
    pids: set[int] = field(default_factory=set)
    left: list[int] = field(default_factory=list)  # still alive after the clean-up (should be none)

    def traceback(self, lines: int = 12) -> list[str]:
        """The last lines of the last traceback the command printed (all of stderr's tail when none), ending at
        its error line. Under torchrun, the failing rank's own: torchrun's agent ends with a traceback and "Root
        Cause" table of its own (``ChildFailedError``) that names only the exit code and the rank it saw fail first,
        which can be a peer that lost the failed rank ("Connection closed by peer"); so where torch prefixes the
        ranks' lines ``[rankN]:`` the rank is ``failed_rank``'s, else the first traceback."""
        tail = own_stderr(self.stderr_tail)
        rank = self.failed_rank()
        mine = self._rank_lines(tail, rank)
        if mine is not None:
            tail = mine
        starts = [i for i, line in enumerate(tail) if line.startswith("Traceback (most recent call last)")]
        if not starts:
            return tail[-lines:]
        first = rank is not None and mine is None and len(starts) > 1
        block = tail[starts[0] : starts[1]] if first else tail[starts[-1] :]
        ends = [i for i, line in enumerate(block) if _ERROR_LINE.match(line)]
        return block[: ends[-1] + 1][-lines:] if ends else block[-lines:]

    def failed_rank(self) -> int | None:
        """The rank that failed: of the ranks whose ``[rankN]:`` lines hold an error, the first whose error is not
        a lost peer; else the rank torchrun's "Root Cause (first observed failure)" table names; None without one."""
        tail = own_stderr(self.stderr_tail)
        errors: dict[int, str] = {}
        for line in tail:
            m = _RANK_TAG.match(line)
            if m and _ERROR_LINE.match(m.group(2)):
                errors[int(m.group(1))] = m.group(2)
        own = [r for r, e in sorted(errors.items()) if not _PEER_LOST.search(e)]
        if own:
            return own[0]
        at = next((i for i, line in enumerate(self.stderr_tail) if "Root Cause (first observed failure)" in line), None)
        if at is None:
            return None
        found = next((m for line in self.stderr_tail[at:] if (m := _ROOT_RANK.match(line))), None)
        return int(found.group(1)) if found else None

    @staticmethod
    def _rank_lines(tail: list[str], rank: int | None) -> list[str] | None:
        """``rank``'s own lines where torch prefixed them ``[rankN]:``; None where it did not."""
        if rank is None:
            return None
        tagged = [m for line in tail if (m := _RANK_TAG.match(line))]
        mine = [m.group(2) for m in tagged if int(m.group(1)) == rank]
        return mine or None


_AGENT_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")  # torchrun's Root Cause table: "  rank      : 1 (local_rank: 1)"
# A rank's error that is another rank's failure seen from here (gloo, NCCL, the store): not the cause.
_PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote (worker|process)|"
                        r"NCCL communicator was aborted|TCPStore|timed out", re.IGNORECASE)  # fmt: skip
_RANK_TAG = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")  # torch prefixes a rank's stderr lines under torchrun
_ERROR_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b"
)  # "RuntimeError: ...", "KeyboardInterrupt"
# The agent's own log lines (torch's glog-style prefix: E1207 09:25:41.381000 26512 .../elastic/...py:1002] ...)
_AGENT_LOG = re.compile(r"^[DIWEF]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/")


def own_stderr(tail: list[str]) -> list[str]:
    """``tail`` without torchrun's failure report at its end (from the agent's traceback that raises
    ``ChildFailedError`` on); unchanged when there is none, or when nothing comes before it."""
    raised = [i for i, line in enumerate(tail) if line.startswith(_AGENT_FAILED)]
    if not raised:
        return tail
    starts = [i for i, line in enumerate(tail[: raised[-1]]) if line.startswith("Traceback (most recent call last)")]
    kept = [line for line in tail[: starts[-1] if starts else raised[-1]] if not _AGENT_LOG.match(line)]
    return kept or tail


class _Tails:
    """The records of the complete JSON lines appended to every ``events-*.jsonl`` of a folder since the last
    call, each line parsed once; ``dropped`` counts those of an unknown kind or broken (kept out)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}
        self.dropped = 0

    def read(self) -> list[Event]:
        out: list[Event] = []
        for path in sorted(self.folder.glob("events-*.jsonl")):
            try:
                with path.open(encoding="utf-8") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    text = fh.read()
                    self.offsets[path] = fh.tell()
            except OSError:
                continue
            lines = (self.partial.get(path, "") + text).split("\n")
            self.partial[path] = lines.pop()
            for line in lines:
                event = parse_line(line)
                if event is None:
                    self.dropped += 1
                else:
                    out.append(event)
        return out


def environment(
    folder: Path,
    overrides: Mapping[str, Any] | None,
    count_step: int = 0,
    peak: bool = False,
    model: Mapping[str, Any] | None = None,
    ddp: str = "",
    profile_step: int = 0,
    split: bool = False,
) -> dict[str, str]:
    """The user's environment with the start-up folder first on PYTHONPATH (theirs kept after it); ``count_step``
    > 0 asks the agent to count that optimizer step's FLOPs (the last warm-up step: counting slows it); ``peak``
    asks for each step's CUDA allocator peak; ``model`` is a model-side change for the agent to apply; ``ddp``
    "skip" runs DDP without its exchange (the exchange A/B); ``profile_step`` > 0 asks for that optimizer step's
    CUDA kernels under torch.profiler (a warm-up step: profiling slows it; nothing on the CPU); ``split`` asks for
    the dataset's transforms timed step by step in a sample of its batches."""
    env = dict(os.environ)
    for name in (COUNT_ENV, PEAK_ENV, MODEL_ENV, DDP_ENV, PROFILE_ENV, SPLIT_ENV):
        env.pop(name, None)
    if split:
        env[SPLIT_ENV] = str(SPLIT_EVERY)
    if ddp:
        env[DDP_ENV] = ddp
    if model:
        env[MODEL_ENV] = json.dumps(dict(model))
    if count_step > 0:
        env[COUNT_ENV] = str(count_step)
    if peak:
        env[PEAK_ENV] = "1"
    if profile_step > 0:
        env[PROFILE_ENV] = str(profile_step)
    theirs = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(folder / "inject") + (os.pathsep + theirs if theirs else "")
    env[EVENTS_ENV] = str(folder / "events")
    if overrides:
        env[LOADER_ENV] = json.dumps(dict(overrides))
    else:
        env.pop(LOADER_ENV, None)
    return env


def _stage(folder: Path) -> None:
    (folder / "inject").mkdir()
    (folder / "events").mkdir()
    for name in ("sitecustomize.py", "_gpu_preflight_agent.py"):
        shutil.copy(INJECT / name, folder / "inject" / name)


def run_command(
    argv: Sequence[str],
    rule: StopRule,
    cwd: str,
    echo: IO[bytes] | None,
    stdout: int | IO[Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    on_event: Callable[[Event | Waiting], None] = lambda e: None,
    on_start: Callable[[int], None] = lambda pid: None,
    peak: bool = False,
    model: Mapping[str, Any] | None = None,
    ddp: str = "",
    profile: bool = True,
    split: bool = False,
) -> CommandRun:
    """Run ``argv`` under the agent until it ends or the rule stops it; nothing it started is left running.

    ``echo``: where the command's stderr goes as it comes (None: only kept for the report); ``stdout``: its
    standard output (None: this process's; ``subprocess.DEVNULL`` to hide it); ``profile``: the measured run's
    kernel profile on a GPU (``verify.profile_steps`` > 0), one warm-up step (the one before the FLOP count's:
    the first is start-up), with ``rule.warmup`` 3 or more; re-runs never profile. ``split``: the measured run's
    per-transform timing of a sample of batches (``SPLIT_EVERY``); re-runs never (they are compared with each other).
    """
    run = CommandRun(argv=tuple(argv))
    with Reaper() as reaper, tempfile.TemporaryDirectory(prefix="gpu-preflight-command-") as tmp:
        folder = Path(tmp)
        _stage(folder)
        start = time.monotonic()
        main = not (overrides or model or ddp)  # the measured run, not a re-run
        count = rule.warmup if rule.warmup >= 2 and main else 0  # the main run's only
        profiled = rule.warmup - 1 if profile and rule.warmup >= 3 and main else 0
        env = environment(folder, overrides, count, peak, model, ddp, profiled, split=split and main)
        proc = session.start(argv, cwd, env, stdout, subprocess.PIPE)
        on_start(proc.pid)
        tee = threading.Thread(target=_tee, args=(proc, echo, run), daemon=True)
        tee.start()
        tails = _Tails(folder / "events")
        try:
            _watch(proc, tails, run, rule, on_event)
        except KeyboardInterrupt:
            run.interrupted, run.ended = True, "interrupted"
        finally:
            with _ctrl_c_noted(run):  # a Ctrl-C while the command shuts down must not lose the report
                if proc.poll() is None:
                    run.stopped_by_verify = True
                    _stop(proc, run, folder / "events")
                proc.wait()
                _clean_up(run, reaper)
                tee.join(timeout=5)
                run.events += tails.read()
                run.dropped = tails.dropped
        run.returncode = proc.returncode
        run.seconds = time.monotonic() - start
    if not run.ended:
        run.ended = "exited" if proc.returncode == 0 else "crashed"
    if not any(isinstance(e, Hello) for e in run.events) and run.ended in ("exited", "crashed"):
        run.ended = "no-torch"
    return run


@contextlib.contextmanager
def _ctrl_c_noted(run: CommandRun) -> Iterator[None]:
    """While the command is stopped and cleaned up, Ctrl-C (SIGINT) is noted as an interruption instead of raised:
    raised there, it ended verify with no report while the DataLoader's workers were shutting down. The stop
    itself escalates on its own (SIGINT, SIGTERM, SIGKILL after their grace times). Main thread only, where
    Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, frame: object) -> None:
        run.interrupted = True
        run.ended = run.ended or "interrupted"

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _tee(proc: subprocess.Popen[bytes], echo: IO[bytes] | None, run: CommandRun) -> None:
    """Pass the command's stderr through as it comes and keep its last lines (the traceback of a crash)."""
    # Enough for the rank that failed first: under torchrun the peers' tracebacks (gloo's run to ~40 lines each) and
    # torchrun's own report come after its error.
    tail: collections.deque[str] = collections.deque(maxlen=300)
    assert proc.stderr is not None
    for raw in iter(proc.stderr.readline, b""):
        if echo is not None:
            with contextlib.suppress(OSError, ValueError):
                echo.write(raw)
                echo.flush()
        tail.append(raw.decode("utf-8", "replace").rstrip("\n"))
        run.stderr_tail = list(tail)


def step_counts(events: Sequence[Event]) -> tuple[dict[int | str, int], int]:
    """Optimizer steps per rank (a process without a rank counts as its own), and how many ranks this verify can
    see step: the ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``; across nodes each node's verify watches its
    own), else the world size."""
    counts: dict[int | str, int] = {}
    world = 1
    for e in events:
        if not isinstance(e, StepLine):
            continue
        counts[e.key] = counts.get(e.key, 0) + 1
        world = max(world, e.local_world_size or e.world_size or 1)
    return counts, world


def _watch(
    proc: subprocess.Popen[bytes],
    tails: _Tails,
    run: CommandRun,
    rule: StopRule,
    on_event: Callable[[Event | Waiting], None],
) -> None:
    """Poll until the command ends or a rule says stop (``run.ended`` then names the rule)."""
    start = last_step = told = time.monotonic()
    tree_at, measured_at, world = 0.0, None, 1
    counts: dict[int | str, int] = {}
    target = rule.warmup + rule.steps
    while proc.poll() is None:
        news = tails.read()
        run.events += news
        for event in news:
            on_event(event)
        now = time.monotonic()
        if any(isinstance(e, StepLine) for e in news):
            last_step = told = now
            counts, world = step_counts(run.events)
        elif now - told >= PROGRESS_EVERY_S:  # a long step (or start-up) says it is still going
            told = now
            on_event(Waiting(seconds=now - last_step, steps=max(counts.values(), default=0)))
        if now - tree_at >= TREE_EVERY_S:
            run.pids |= process_tree(proc.pid)
            tree_at = now
        reached = [k for k, n in counts.items() if n >= (rule.warmup + 1 if rule.seconds else target)]
        if rule.seconds and len(reached) >= world and measured_at is None:
            measured_at = now
        if (rule.seconds and measured_at is not None and now - measured_at >= rule.seconds) or (
            not rule.seconds and len(reached) >= world
        ):
            run.ended, run.stop_reason = "stopped", "seconds" if rule.seconds else "steps"
            return
        early = _early(run.events, counts, world, rule, now)
        if early:
            run.ended, run.stop_reason = "stopped", early
            return
        if rule.limit_s and now - start >= rule.limit_s:
            run.ended = "limit"
            return
        if not counts and now - start >= rule.first_step_s:
            run.ended = "no-step"
            return
        if counts and now - last_step >= stall_after(rule, run.events, now):
            run.ended = "stalled"
            return
        time.sleep(_POLL_S)


PROGRESS_EVERY_S = 15.0  # without a step for this long, the caller hears that the step is still running
STALL_PACES = 5  # past the budget, a command is stalled after this many of its own step times without a step
STALL_FLOOR_S = 15.0  # ... and never sooner than this (a save or an evaluation between steps). Tool-defined.


def stall_after(rule: StopRule, events: Sequence[Event], now: float) -> float:
    """Seconds without a step that make the command stalled: ``stall_s`` (verify.stall_timeout_s) while the
    budget lasts; once it is spent, ``STALL_PACES`` of the command's own step time (the median step after the
    first, or the first alone; at least ``STALL_FLOOR_S``), so that a run that stops stepping is judged within the
    budget plus a few of its steps, not minutes later."""
    stop = rule.stop
    if stop is None or not stop.deadline or now < stop.deadline:
        return rule.stall_s
    lines = [e for e in events if isinstance(e, StepLine) and e.lead]
    paces = sorted(e.seconds for e in lines[1:] or lines)
    if not paces:
        return rule.stall_s
    return min(rule.stall_s, max(STALL_FLOOR_S, STALL_PACES * paces[len(paces) // 2]))


def _early(events: Sequence[Event], counts: dict[int | str, int], world: int, rule: StopRule, now: float) -> str:
    """ "stable" or "budget" when the stop rule ends the measured steps before ``steps``; "" to go on."""
    stop = rule.stop
    if stop is None or rule.seconds or len(counts) < world or not counts:
        return ""
    done = min(counts.values())
    if stop.deadline and now >= stop.deadline and done >= 2:
        # the budget is spent: stop now, whatever was measured (at least one step after the one holding the
        # start-up); the judge takes its measured steps from the warm-up's when too few came after it
        return "budget"
    if done - rule.warmup < min(MIN_MEASURED, rule.steps):
        return ""
    if world == 1 and done - rule.warmup >= stop.min_steps:
        lead = max(counts, key=lambda k: counts[k])
        lines = [e for e in events if isinstance(e, StepLine) and e.key == lead][rule.warmup :]
        if stable(rows_of(lines), stop.min_steps, stop.width, stop.batches):
            return "stable"
    return ""


def _stop(proc: subprocess.Popen[bytes], run: CommandRun, events: Path) -> None:
    """Ask a script that listens to stop (``_ask``) and give it its grace; then (or at once) SIGINT, then
    SIGTERM, then SIGKILL to the command's process group, each after its grace time."""
    run.pids |= process_tree(proc.pid)
    grace = _ask(events, run) if run.ended in ASKED_WHEN else None
    if grace is not None:
        run.asked = True
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return
        run.pids |= process_tree(proc.pid)
    session.stop_group(proc, ((signal.SIGINT, INT_GRACE_S), (signal.SIGTERM, TERM_GRACE_S)), run.signals)


def _clean_up(run: CommandRun, reaper: Reaper) -> None:
    """Kill by id what the command left (``Reaper.clean_up``): every process it started that is still alive."""
    leftovers, run.left = reaper.clean_up(run.pids)
    run.pids |= leftovers


def _ask(folder: Path, run: CommandRun) -> float | None:
    """Write the stop file (``{"at": N}``) the agent's ``should_stop()`` reads, where a process of the command
    asked it (its ``listening-PID`` file); the grace the command then gets, or None when nothing listens or its
    ranks span nodes (each node's verify stops its own: they would not ask for one step). One process is asked to
    stop now; several ranks for the step count ``ASK_LAG_S`` ahead of the furthest at the quickest pace."""
    if not any(folder.glob("listening-*")):
        return None
    counts, world = step_counts(run.events)
    lines = [e for e in run.events if isinstance(e, StepLine)]
    if any((e.world_size or 1) > world for e in lines):
        return None
    paces = sorted(e.seconds + e.checkpoint for e in lines[-50:])
    pace = max(paces[len(paces) // 4], 1e-4) if paces else 0.0
    ahead = math.ceil(ASK_LAG_S / pace) + 1 if world > 1 and pace else 0
    at = max(counts.values(), default=0) + ahead if world > 1 else 0
    partial = folder / "stop.partial"  # whole or absent: the agent never reads half a file
    partial.write_text(json.dumps({"at": at}), encoding="utf-8")
    os.replace(partial, folder / "stop")
    return ASK_GRACE_S + ahead * pace
