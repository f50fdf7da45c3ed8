"""Bad nodes in Slurm's terms: the drain command for each, the ``srun --exclude=`` list, and the resume rule.

Detection and remediation stay apart, as the trusted health tools keep them (docs/sources.md#nhc-drain-prefix):
the report prints the commands; only ``--drain`` runs them. A drain reason starts with ``gpu-preflight:``, and a
later healthy run resumes a node only when its current reason starts with that prefix, so a node that an operator
or another tool drained stays drained. scontrol runs behind ``Runner`` (argv and timeout in, stdout out), which
tests replace with a fake that answers real ``scontrol show node -o`` lines.

Command line equivalents: ``scontrol show node -o NAME``, ``scontrol update NodeName=NAME State=DRAIN Reason=...``,
``scontrol update NodeName=NAME State=RESUME``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from checks.errors import PreflightError
from checks.hostlist import compress_nodelist
from checks.result import Result, Status

PREFIX = "gpu-preflight:"
Runner = Callable[[list[str], float], str]
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$")
_NAME = re.compile(r"^NodeName=(\S+)")
_GRES = re.compile(r"(?:^|\s)Gres=(\S+)")


class SlurmError(PreflightError):
    """scontrol is missing, failed or answered something this module cannot read."""


@dataclass(frozen=True)
class Drain:
    """One failing node: the reason it gets and the command that drains it."""

    node: str
    reason: str

    def argv(self) -> list[str]:
        return ["scontrol", "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={self.reason}"]

    def command(self) -> str:
        """The command as a shell runs it (the reason quoted with shlex)."""
        return f"scontrol update NodeName={shlex.quote(self.node)} State=DRAIN Reason={shlex.quote(self.reason)}"


@dataclass(frozen=True)
class NodeState:
    """A node as ``scontrol show node -o`` shows it: its state flags (``IDLE+DRAIN``) and drain reason."""

    name: str
    state: str
    reason: str
    gres: str = ""  # ``gpu:h100:8``; '' for ``(null)``

    @property
    def gpus(self) -> int:
        """The GPUs Slurm schedules on this node: the counts of its ``gpu`` Gres (``gpu:h100:8,gpu:a100:2(S:0)``)."""
        count = 0
        for item in re.sub(r"\([^)]*\)", "", self.gres).split(","):
            fields = item.split(":")
            if fields[0] == "gpu":
                count += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
        return count

    @property
    def drained(self) -> bool:
        return any(flag in ("DRAIN", "DRAINED", "DRAINING") for flag in self.state.upper().split("+"))

    @property
    def ours(self) -> bool:
        """Drained by gpu-preflight (the reason starts with its prefix), so a healthy run may resume it."""
        return self.reason.startswith(PREFIX)


def drain_reason(result: Result, more: int, max_chars: int) -> str:
    """``gpu-preflight: <check id> <subject> <summary>`` on one line, cut to ``max_chars``."""
    words = [PREFIX, result.id, result.subject or "", " ".join(result.summary.split())]
    reason = " ".join(word for word in words if word) + (f" (+{more} more)" if more else "")
    return reason if len(reason) <= max_chars else reason[: max_chars - 3].rstrip() + "..."


def drain_for(node: str, results: Iterable[Result], max_chars: int) -> Drain | None:
    """The drain of ``node`` for its first failing result (None when nothing failed)."""
    failed = [r for r in results if r.status is Status.FAIL]
    return Drain(node, drain_reason(failed[0], len(failed) - 1, max_chars)) if failed else None


def exclude_option(nodes: Sequence[str]) -> str:
    """``--exclude=gpu-[017,021]`` for the user's next srun or sbatch ('' when no node is bad)."""
    return f"--exclude={compress_nodelist(nodes)}" if nodes else ""


def render_remediation(drains: Sequence[Drain]) -> list[str]:
    """The lines the report prints: each drain command, then the exclude option for the next job."""
    if not drains:
        return []
    lines = ["drain the failing nodes as a Slurm operator (or run again with --drain):"]
    lines += [f"  {drain.command()}" for drain in drains]
    lines.append(f"keep them out of your next job: srun {exclude_option([d.node for d in drains])} ...")
    return lines


def parse_node_line(line: str) -> NodeState:
    """One ``scontrol show node -o`` line; the reason loses its trailing ``[user@time]``."""
    name, state = _NAME.search(line.strip()), _STATE.search(line)
    if not name or not state:
        raise SlurmError(f"cannot read scontrol's node line: {line.strip()[:80]!r}")
    reason, gres = _REASON.search(line), _GRES.search(line)
    gres_text = gres.group(1) if gres and gres.group(1) != "(null)" else ""
    return NodeState(name.group(1), state.group(1), reason.group(1).strip() if reason else "", gres_text)


def run_scontrol(argv: list[str], timeout_s: float) -> str:
    """Run scontrol and return its output; the real ``Runner``."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True)
    return done.stdout


def _call(runner: Runner, argv: list[str], timeout_s: float) -> str:
    try:
        return runner(argv, timeout_s)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here", hint="run on a node of the Slurm cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)} did not answer within {timeout_s:g} s") from None
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip().splitlines()
        why = f": {said[-1]}" if said else ""
        raise SlurmError(f"{shlex.join(argv)} failed with exit {exc.returncode}{why}") from None


def node_state(node: str, runner: Runner, timeout_s: float) -> NodeState:
    """The node's current state and reason (``scontrol show node -o NODE``)."""
    lines = [line for line in _call(runner, ["scontrol", "show", "node", "-o", node], timeout_s).splitlines() if line]
    if len(lines) != 1:
        raise SlurmError(f"scontrol show node -o {node} answered {len(lines)} lines, expected one")
    return parse_node_line(lines[0])


def drain(plan: Drain, runner: Runner, timeout_s: float) -> None:
    """Drain the node (``--drain`` only)."""
    _call(runner, plan.argv(), timeout_s)


def resume_if_ours(node: str, runner: Runner, timeout_s: float) -> NodeState | None:
    """Resume ``node`` after a healthy run when gpu-preflight drained it; the state it had, or None if left alone."""
    state = node_state(node, runner, timeout_s)
    if not (state.drained and state.ours):
        return None
    _call(runner, ["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout_s)
    return state
