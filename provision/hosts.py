"""Which hosts to bootstrap: ``--hosts h1,h2``, a hosts file, or ``SLURM_JOB_NODELIST``.

Host strings are ``[user@]host[:port]`` (``host`` may be an alias from ``~/.ssh/config``, or an IPv6 address
in brackets); a password (``user:password@host``) is refused, and never printed. A hosts file has one host per line in that form, optionally followed by DeepSpeed's ``slots=N``
and gpu-preflight's ``python=PATH`` (the remote Python) and ``addr=ADDRESS`` (where the other hosts reach this
one); ``#`` starts a comment. Anything else is refused before any connection is made: a host string never
reaches a shell, and its characters are restricted so that it cannot mean anything to one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from checks.errors import PreflightError
from checks.fileio import read_text
from checks.hostlist import (
    NO_PASSWORDS,
    expand_nodelist,  # the one expander; re-exported for callers of this module
    has_password,
    password_error,
)

NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$")
IPV6 = re.compile(r"^\[([0-9A-Fa-f:.]+)\]$")
USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
PATH_TEXT = re.compile(r"^[A-Za-z0-9_./+~-]+$")
_PASSWORD_KEYS = ("password", "passwd", "pass", "pw")
ALLOWED = "letters, digits, '.', '-' and '_' (user@host:port; IPv6 in [brackets])"


@dataclass(frozen=True)
class HostSpec:
    """One host to bootstrap. ``name`` is the string as given: the label in reports."""

    name: str
    host: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    python: str | None = None
    addr: str | None = None


def _bad(text: str, why: str, where: str = "") -> PreflightError:
    return PreflightError(f"bad host {text!r}{where}: {why}", hint=f"hosts may contain only {ALLOWED}")


def parse_host(text: str, where: str = "") -> HostSpec:
    """Parse ``[user@]host[:port]``; raise PreflightError (exit 2) for anything a shell could misread."""
    if has_password(text):
        raise password_error(text, where)
    user, _, rest = text.rpartition("@") if "@" in text else ("", "", text)
    if user and not USER.match(user):
        raise _bad(text, "the user name has characters that are not allowed", where)
    port: int | None = None
    six = re.match(r"^(\[[^\]]*\])(?::(\d+))?$", rest)
    if six:
        host_part, port_text = six.group(1), six.group(2)
        if not IPV6.match(host_part):
            raise _bad(text, "not an IPv6 address in brackets", where)
        host = IPV6.match(host_part).group(1)  # type: ignore[union-attr]
    else:
        host, _, port_text = rest.partition(":")
        if not NAME.match(host) or len(host) > 253:
            raise _bad(text, "not a host name, alias or address", where)
    if port_text:
        port = int(port_text) if port_text.isdigit() else 0
        if not 1 <= port <= 65535:
            raise _bad(text, "the port must be a number from 1 to 65535", where)
    return HostSpec(name=text, host=host, user=user or None, port=port)


def parse_host_list(text: str) -> list[HostSpec]:
    """``--hosts h1,h2,...`` (spaces around commas are allowed)."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise PreflightError("--hosts is empty", hint="e.g. --hosts gpu1,gpu2")
    return _unique([parse_host(item) for item in items if item])


def _options(spec: HostSpec, fields: list[str], where: str) -> HostSpec:
    values: dict[str, object] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if key.lower() in _PASSWORD_KEYS:
            raise PreflightError(f"{where}: passwords are not supported", hint=NO_PASSWORDS)
        if not sep or key not in ("slots", "python", "addr"):
            raise PreflightError(f"{where}: unknown field {key!r}", hint="fields: slots=N python=PATH addr=ADDRESS")
        if key == "slots" and not value.isdigit():
            raise PreflightError(f"{where}: slots must be a number, got {value!r}")
        if key in ("python", "addr") and not PATH_TEXT.match(value):
            raise PreflightError(f"{where}: {key}={value!r} has characters that are not allowed")
        values[key] = int(value) if key == "slots" else value
    return HostSpec(spec.name, spec.host, spec.user, spec.port, **values)  # type: ignore[arg-type]


def read_hosts_file(path: Path) -> list[HostSpec]:
    """Read a hosts file: ``host [slots=N] [python=PATH] [addr=ADDRESS]`` per line, ``#`` comments."""
    lines = read_text(path, "hosts file").splitlines()
    specs = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if fields:
            where = f"{path}:{number}"
            specs.append(_options(parse_host(fields[0], f" at {where}"), fields[1:], where))
    if not specs:
        raise PreflightError(f"hosts file {path} names no host", hint="one host per line: gpu1 slots=8")
    return _unique(specs)


def _unique(specs: list[HostSpec]) -> list[HostSpec]:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise PreflightError(f"host {spec.name} is listed twice")
        seen.add(spec.name)
    return specs


def select_hosts(
    hosts: str, hosts_file: str, environ: Mapping[str, str], use_slurm: bool
) -> tuple[list[HostSpec], str]:
    """Choose the hosts of this run and say where they came from; ([], "") means this machine only."""
    if hosts and hosts_file:
        raise PreflightError("give --hosts or --hosts-file, not both")
    if hosts:
        return parse_host_list(hosts), "--hosts"
    if hosts_file:
        return read_hosts_file(Path(hosts_file).expanduser()), f"--hosts-file {hosts_file}"
    nodelist = environ.get("SLURM_JOB_NODELIST", "")
    if use_slurm and nodelist:
        names = expand_nodelist(nodelist)
        if len(names) >= 2:
            return _unique([parse_host(n, " in SLURM_JOB_NODELIST") for n in names]), "SLURM_JOB_NODELIST"
    return [], ""
