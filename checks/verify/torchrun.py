"""A torchrun command read apart: what launches it, torchrun's own flags without the ones that place the run on
nodes, and the program with its arguments. ``--hosts`` (``checks/verify/hosts.py``) sets the node flags per host;
the solo leg (``checks/verify/user/solo.py``) replaces them with one process. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# torchrun's flags that place the run (set again by whoever runs it elsewhere; ``--rdzv-*`` too), and those that
# take no value.
NODE_FLAGS = ("nnodes", "node-rank", "master-addr", "master-port", "nproc-per-node", "standalone")
VALUELESS = ("standalone", "m", "module", "no-python", "run-path")


@dataclass(frozen=True)
class Torchrun:
    """``prefix``: a leading ``env NAME=VALUE ...``; ``head``: ``torchrun`` or ``python -m torch.distributed.run``;
    ``flags``: torchrun's own flags, the node ones left out; ``program``: the script and its arguments."""

    prefix: tuple[str, ...]
    head: tuple[str, ...]
    flags: tuple[str, ...]
    program: tuple[str, ...]


NOT_TORCHRUN = "not torchrun"  # parse's answer for a command another launcher (or none) runs
NO_PROGRAM = "no program"  # torchrun's flags and nothing after them


def parse(argv: Sequence[str]) -> Torchrun | str:
    """``argv`` read apart, or ``NOT_TORCHRUN`` / ``NO_PROGRAM``."""
    given = 1 if argv and os.path.basename(argv[0]) == "env" else 0
    while given and given < len(argv) and "=" in argv[given] and not argv[given].startswith("-"):
        given += 1
    prefix, command = tuple(argv[:given]), list(argv[given:])
    first = os.path.basename(command[0]) if command else ""
    if first == "torchrun":
        head, rest = command[:1], command[1:]
    elif first.startswith("python") and command[1:3] == ["-m", "torch.distributed.run"]:
        head, rest = command[:3], command[3:]
    else:
        return NOT_TORCHRUN
    kept: list[str] = []
    i = 0
    while i < len(rest) and rest[i].startswith("-"):  # torchrun's flags, up to the program
        name = rest[i].lstrip("-").split("=", 1)[0].replace("_", "-")
        value = rest[i + 1 : i + 2] if "=" not in rest[i] and name not in VALUELESS else []
        if name not in NODE_FLAGS and not name.startswith("rdzv-"):
            kept += [rest[i], *value]
        i += 1 + len(value)
    if i >= len(rest):
        return NO_PROGRAM
    return Torchrun(prefix, tuple(head), tuple(kept), tuple(rest[i:]))
