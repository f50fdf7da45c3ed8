"""Turn Invoke's own failures to parse the task flags into one-line usage errors (exit 2).

Invoke 2.2.1 rejects an unknown flag or stray word with ``ParseError("No idea what '--jsn' is!")`` (exit 1,
without naming the task), a value flag given last with ``ParseError("Flag <Argument: json (j)> needed value
...")``, and lets a value its flag's type cannot cast (``--steps abc``) escape from ``Argument.set_value`` as a
``ValueError`` traceback. Each becomes a ``PreflightError`` naming the task and the flag, with the closest real
flag or task when there is one and the ``invoke --help TASK`` that lists them.
"""

from __future__ import annotations

import ast
import difflib
import re
import traceback
from collections.abc import Iterable

from invoke.exceptions import ParseError
from invoke.parser import Argument, ParserContext, to_flag
from invoke.parser.parser import ParseMachine

from checks.errors import PreflightError

_UNKNOWN = re.compile(r"^No idea what (.+) is!$")
_NO_VALUE = re.compile(r"^Flag <Argument: ([\w-]+)")
_KINDS = {int: "an integer", float: "a number"}


def _closest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _help(task: str | None) -> str:
    return f"`invoke --help {task}` lists its flags" if task else "`invoke --list` lists the tasks"


def _hint(task: str | None, closest: str | None) -> str:
    return (f"did you mean {closest}? " if closest else "") + _help(task)


def _unknown(token: str, context: ParserContext | None, tasks: Iterable[str]) -> PreflightError:
    task = context.name if context is not None else None
    if token.startswith("-"):
        flags = [f for f in context.flag_names() if f.startswith("--")] if context is not None else []
        if task:
            return PreflightError(f"{task} has no flag {token}", hint=_hint(task, _closest(token, flags)))
        hint = (f"did you mean {close}? " if (close := _closest(token, flags)) else "") + "`invoke --help` lists them"
        return PreflightError(f"invoke has no flag {token}", hint=hint)
    close = _closest(token, tasks)
    if close or not task:
        return PreflightError(f"no task named {token!r}", hint=_hint(None, close))
    return PreflightError(
        f"unexpected argument {token!r} after {task}", hint="on/off flags take no value; " + _help(task)
    )


def _cast_failure(exc: ValueError) -> tuple[ParseMachine, Argument, object] | None:
    """The parser state and flag of a value Invoke could not cast, read from the traceback's frames."""
    machine: ParseMachine | None = None
    found: tuple[Argument, object] | None = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, ParseMachine):
            machine = owner
        elif isinstance(owner, Argument) and "value" in frame.f_locals:
            found = owner, frame.f_locals["value"]
    return (machine, *found) if machine is not None and found is not None else None


def _bad_value(exc: ValueError) -> PreflightError | None:
    failure = _cast_failure(exc)
    if failure is None:
        return None  # a ValueError from somewhere else (a broken task definition): keep its traceback
    machine, arg, value = failure
    task = machine.context.name if machine.context is not None else None
    flag = to_flag(arg.name or "")
    kind = _KINDS.get(arg.kind, f"a {getattr(arg.kind, '__name__', 'value')}")
    return PreflightError(f"{' '.join(filter(None, (task, flag)))} takes {kind}, not {value!r}", hint=_help(task))


def usage_error(exc: Exception, tasks: Iterable[str]) -> PreflightError | None:
    """The one-line usage error for ``exc`` from parsing the task flags; None when it is no parse failure."""
    if isinstance(exc, ValueError):
        return _bad_value(exc)
    if not isinstance(exc, ParseError):
        return None
    context = exc.context
    task = context.name if context is not None else None
    message = str(exc)
    if unknown := _UNKNOWN.match(message):
        return _unknown(ast.literal_eval(unknown.group(1)), context, tasks)
    if no_value := _NO_VALUE.match(message):
        flag = to_flag(no_value.group(1))
        return PreflightError(f"{' '.join(filter(None, (task, flag)))} needs a value", hint=_help(task))
    return PreflightError(message.rstrip("!"), hint=_help(task))
