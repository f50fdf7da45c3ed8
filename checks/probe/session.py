"""Every child the tool starts: started in a session of its own, its whole tree torn down at the end.

The one launcher under both the torch probe's children (``checks.probe.torch.run_child``: a timeout, then
SIGKILL to the group) and verify's training commands (``checks.verify.user.launch.run_command``: SIGINT, SIGTERM,
SIGKILL to the group, each after its grace time, then every leftover killed by process id). A session of its own
puts the child and everything it starts in one process group that a signal reaches at once, and keeps the
terminal's Ctrl-C away from it: the caller decides how the child is stopped.

``Reaper`` finds what a group signal cannot reach (torchrun's ranks, each in a session of its own, orphaned by a
killed torchrun; a crashed script's DataLoader workers): made a child subreaper (Linux ``prctl``), this process
inherits its descendants' orphans and kills by id every descendant it did not have before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from checks.probe.sample import process_exists, process_tree

_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
_PR_GET_CHILD_SUBREAPER = 37
REAP_TERM_S = 5.0  # a leftover's time between SIGTERM and SIGKILL. Tool-defined.
REAP_KILL_S = 2.0  # how long a SIGKILLed leftover is waited for (the kernel frees it in milliseconds)


def start(
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str] | None,
    stdout: int | IO[Any] | None,
    stderr: int | IO[Any] | None,
    text: bool = False,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in a session (and process group) of its own, in ``cwd`` with ``env`` (None: this one's)."""
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=stdout,
        stderr=stderr,
        text=text,
        start_new_session=True,
    )


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone (or not ours)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(
    proc: subprocess.Popen[Any], ladder: Sequence[tuple[signal.Signals, float]] = (), sent: list[str] | None = None
) -> None:
    """Stop ``proc``'s process group: each signal of ``ladder`` in turn, waiting its grace time for ``proc`` to
    exit, then SIGKILL; ``sent`` gets the name of each signal sent. Returns once ``proc`` is reaped."""
    if proc.poll() is not None:
        return
    for sig, grace in (*ladder, (signal.SIGKILL, None)):
        if signal_group(proc.pid, sig) and sent is not None:
            sent.append(sig.name)
        if grace is None:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return
    proc.wait()


def subreaper(on: bool) -> bool:
    """Make orphaned descendants this process's children, or stop (Linux ``prctl``); False where not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def was_subreaper() -> bool:
    """Whether this process is a child subreaper already (a caller's, or an outer run's)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return bool(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value)
    except (OSError, AttributeError):
        return False


class Reaper:
    """This process as a child subreaper from ``__enter__`` (where it can be one) to ``__exit__``, and the
    processes it had before, so that ``clean_up`` kills only what was started meanwhile."""

    def __enter__(self) -> Reaper:
        self.was = was_subreaper()
        self.on = subreaper(True)
        self.before = process_tree(os.getpid())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on and not self.was:  # orphans of later work go to init again, as before
            subreaper(False)

    def clean_up(self, seen: Iterable[int]) -> tuple[set[int], list[int]]:
        """Kill by id what the child left: as a subreaper, every descendant this process did not have before
        (orphans come to us); else every process in ``seen`` (the child's tree as read while it ran; a reused id
        is not ours: not killed). SIGTERM, then SIGKILL after ``REAP_TERM_S``. Returns the leftovers and those
        still alive after (should be none)."""
        mine = os.getpid()
        descendants = process_tree(mine) - self.before - {mine}
        leftovers = descendants if self.on else (set(seen) | descendants) - {mine}
        alive = [pid for pid in leftovers if process_exists(pid)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + (REAP_TERM_S if sig == signal.SIGTERM else REAP_KILL_S)
            while alive and time.monotonic() < deadline:
                _reap(alive)
                alive = [pid for pid in alive if process_exists(pid)]
                time.sleep(0.05)
            if not alive:
                break
        _reap(list(leftovers))
        return leftovers, sorted(pid for pid in leftovers if process_exists(pid))


def _reap(pids: Sequence[int]) -> None:
    """Collect the exit status of those that are our children now (orphans given to the subreaper)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
