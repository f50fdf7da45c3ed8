"""Slurm host lists: ``gpu-[001-003,007],cpu1`` to names and back.

The one expander of the project: ``SLURM_JOB_NODELIST`` for ``--hosts`` (``provision.hosts``), the job's nodes of
the launch context (``checks.probe.launch``) and the ``srun --exclude=`` list of the remediation all use it. The
form is Slurm's hostlist expression (docs/sources.md#slurm-hostlist): comma-separated names, each with at most
one bracket of comma-separated numbers and ranges whose zero padding is kept. Command line equivalent:
``scontrol show hostnames 'gpu-[001-003,007],cpu1'``.

A host string with a password (``user:password@host``) is refused here too, by :func:`password_error`, with the
password masked: ``--hosts``, a hosts file and a stray word on the command line all echo host strings back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from checks.errors import PreflightError

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
# user:password@host, with or without a scheme (ssh://): the password runs from the user's ':' to the last '@', so
# it may hold ':' and '@' itself.
_CREDENTIALS = re.compile(r"^([a-z][a-z0-9+.-]*://)?([^:@/\s]*):(.*)@([^@]*)$", re.IGNORECASE | re.DOTALL)
NO_PASSWORDS = "use an SSH key: an ssh-agent, or IdentityFile in ~/.ssh/config for the host"


def has_password(text: str) -> bool:
    """Whether ``text`` is ``user:password@host`` (``ssh://`` too)."""
    return _CREDENTIALS.match(text) is not None


def without_password(text: str) -> str:
    """``text`` with the password of a ``user:password@host`` written ``***``; any other text as it is."""
    found = _CREDENTIALS.match(text)
    return f"{found.group(1) or ''}{found.group(2)}:***@{found.group(4)}" if found else text


def password_error(text: str, where: str = "") -> PreflightError:
    """The refusal of a host given with a password: it names the host, never the password."""
    return PreflightError(f"bad host {without_password(text)!r}{where}: passwords are not supported", hint=NO_PASSWORDS)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: 'a[1-2,4],b' -> ['a[1-2,4]', 'b']."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            raise ValueError("unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError("unbalanced brackets")
    return [*parts, current]


def _range_values(spec: str) -> list[str]:
    values = []
    for piece in spec.split(","):
        low, sep, high = piece.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {piece!r}")
        width = len(low)
        values += [str(i).zfill(width) for i in range(int(low), int(high if sep else low) + 1)]
    return values


def _expand(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    return [head + value + rest for value in _range_values(match.group(1)) for rest in _expand(tail)]


def expand_nodelist(text: str, what: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1.

    ``what`` names the list in the error (the variable or option it came from).
    """
    try:
        return [name for item in _split_top(text.strip()) if item for name in _expand(item)]
    except ValueError as exc:
        raise PreflightError(f"{what} {text!r} cannot be read: {exc}") from None


def _runs(numbers: list[str]) -> str:
    """'001','002','003','007' -> '001-003,007' (a run keeps one zero padding)."""
    pieces: list[str] = []
    start = prev = numbers[0]
    for number in [*numbers[1:], ""]:
        if number and len(number) == len(prev) and int(number) == int(prev) + 1:
            prev = number
            continue
        pieces.append(start if start == prev else f"{start}-{prev}")
        start = prev = number
    return ",".join(pieces)


def compress_nodelist(names: Iterable[str]) -> str:
    """The short form of names (groups in order of first appearance): gpu-001 gpu-002 gpu-003 cpu1 -> 'gpu-[001-003],cpu1'.

    Names that share a prefix and end in numbers of one width are grouped; the result expands back to the same
    names (``expand_nodelist``).
    """
    groups: dict[tuple[str, int], list[str]] = {}
    order: list[tuple[str, int] | str] = []
    for name in dict.fromkeys(names):
        match = _TRAILING_NUMBER.match(name)
        if not match:
            order.append(name)
            continue
        key = (match.group(1), len(match.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(match.group(2))
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        numbers = sorted(groups[item], key=int)
        out.append(f"{item[0]}{numbers[0]}" if len(numbers) == 1 else f"{item[0]}[{_runs(numbers)}]")
    return ",".join(out)
