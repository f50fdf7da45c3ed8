"""The hooks Invoke's program runs for gpu-preflight: flag and configuration mistakes become one line and exit 2.

Invoke 2.2.1 gives a task collection no seam before it parses the task flags, so ``tasks.py`` hands the running
program to :func:`adopt` once, and from then on that one program (not Invoke's ``Program`` class) is a
:class:`PreflightProgram` whose configuration is a :class:`CheckedConfig`. Every check runs when the program
reaches the step it guards, never at import:

- the task flags (``PreflightProgram.parse_tasks``): Invoke rejects an unknown flag or stray word with
  ``ParseError("No idea what '--jsn' is!")`` (exit 1, without naming the task), a value flag given last with
  ``ParseError("Flag <Argument: json (j)> needed value ...")``, and lets a value its flag's type cannot cast
  (``--steps abc``) escape from ``Argument.set_value`` as a ``ValueError`` traceback. Each becomes a
  ``PreflightError`` naming the task and the flag, with the closest real flag or task and the
  ``invoke --help TASK`` that lists them;
- the configuration files (``CheckedConfig.load_project`` / ``load_runtime``): each ``preflight`` section is
  validated before Invoke merges it (a value where a section belongs, or a YAML error, is a traceback in
  Invoke), and a ``-f`` / ``INVOKE_RUNTIME_CONFIG`` file that does not exist is an error (Invoke goes on
  without it, and without saying so);
- the ``INVOKE_PREFLIGHT_*`` variables (``CheckedConfig.load_shell_env``): Invoke casts the string to the
  default's type, so a bad number would end in a traceback, an unknown name is silently ignored, and a boolean
  is true for any value but "0" and "" ("false" would mean true). All three are caught first.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from invoke import Config, Program
from invoke.exceptions import ParseError
from invoke.parser import Argument, Parser, ParserContext, to_flag
from invoke.parser.parser import ParseMachine

from checks.config import load_defaults, validate_files
from checks.errors import PreflightError

# --- task flags ---------------------------------------------------------------------------------------------

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


# --- INVOKE_PREFLIGHT_* variables ---------------------------------------------------------------------------

PREFIX = "INVOKE_PREFLIGHT_"


def _leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def env_names(defaults: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], Any]]:
    """Every valid variable name -> (key path, default)."""
    return {PREFIX + "_".join(p).upper(): (p, v) for p, v in _leaves(defaults)}


def _check_value(name: str, path: tuple[str, ...], default: Any, raw: str) -> None:
    key = "preflight." + ".".join(path)
    if isinstance(default, bool):
        if raw not in ("0", "1", ""):
            raise PreflightError(
                f"{name}={raw!r} for {key}: use 1 or 0", hint="Invoke reads every value except '0' and '' as true"
            )
    elif isinstance(default, (list, tuple)):
        raise PreflightError(f"{name} cannot set the list {key}", hint="set it in invoke.yaml or a -f FILE instead")
    elif isinstance(default, (int, float)):
        try:
            type(default)(raw)
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise PreflightError(f"{name}={raw!r} for {key} must be {kind}", hint=f"default: {default!r}") from None


def check_env_overrides(environ: Mapping[str, str], defaults: dict[str, Any]) -> None:
    """Raise ``PreflightError`` (exit 2) for the first unknown or uncastable ``INVOKE_PREFLIGHT_*`` variable."""
    names = env_names(defaults)
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "see templates/defaults.yaml for the keys"
            raise PreflightError(f"unknown configuration variable {name}", hint=hint)
        path, default = names[name]
        _check_value(name, path, default, environ[name])


# --- configuration files ------------------------------------------------------------------------------------

_SUFFIXES = ("yaml", "yml", "json")  # Invoke also reads invoke.py: code, not data, so it is not validated


def missing_runtime_file(path: str | None) -> PreflightError | None:
    """The error for a runtime configuration file (``-f`` or ``INVOKE_RUNTIME_CONFIG``) that does not exist."""
    if not path or Path(os.path.expanduser(path)).exists():
        return None
    return PreflightError(
        f"configuration file {Path(os.path.expanduser(path))} does not exist",
        hint="fix the path given with -f / --config / INVOKE_RUNTIME_CONFIG",
    )


INVOKE_KEYS = tuple(Config.global_defaults())  # run, runners, sudo, tasks, timeouts in Invoke 2.2


class CheckedConfig(Config):
    """Invoke's configuration, each source validated just before Invoke loads, merges or casts it."""

    def _candidates(self, prefix: str | None) -> list[Path]:
        stem = (prefix or "") + (self.file_prefix or self.prefix)
        return [Path(os.path.expanduser(f"{stem}.{suffix}")) for suffix in _SUFFIXES] if prefix else []

    def load_project(self, merge: bool = True) -> None:
        """Validate the system, user and project files (the project's is loaded next), then load it."""
        shared = [path for prefix in (self._system_prefix, self._user_prefix) for path in self._candidates(prefix)]
        validate_files(shared, INVOKE_KEYS, own=False)  # these may serve other Invoke projects too
        validate_files(self._candidates(self._project_prefix), INVOKE_KEYS)
        super().load_project(merge=merge)

    def load_runtime(self, merge: bool = True) -> None:
        """Refuse a runtime file that does not exist and validate the one that does, then load it."""
        path = self._runtime_path
        if error := missing_runtime_file(path):
            raise error
        if path:
            validate_files([Path(os.path.expanduser(path))], INVOKE_KEYS)
        super().load_runtime(merge=merge)

    def load_shell_env(self) -> None:
        """Validate the ``INVOKE_PREFLIGHT_*`` variables, then let Invoke cast and load them."""
        check_env_overrides(os.environ, load_defaults())
        super().load_shell_env()


# --- the program ------------------------------------------------------------------------------------------


# Invoke gives every task flag the first free letter of its name as a short flag, so ``--hosts`` took ``-h`` and
# ``invoke bootstrap -h`` asked for a host instead of showing the help. After a task, ``-h`` is the core help
# flag (which Invoke then reads as "help for this task") only when no task flag has it.
RESERVED_SHORT_FLAGS = ("h",)


def task_contexts(collection: Any, ignore_unknown_help: bool | None = None) -> list[ParserContext]:
    """``Collection.to_contexts`` with the reserved short flags taken off every task flag.

    ``Task.get_arguments`` pops each flag's help text out of ``task.help``; it is put back, so that a second
    program over the same tasks (the in-process tests) still shows it.
    """
    contexts = []
    for primary, aliases in collection.task_names.items():
        task = collection[primary]
        kept = dict(task.help)
        args = task.get_arguments(ignore_unknown_help=ignore_unknown_help)
        task.help = kept
        for arg in args:
            arg.names = tuple(n for n in arg.names if n not in RESERVED_SHORT_FLAGS)
        contexts.append(ParserContext(name=primary, aliases=aliases, args=args))
    return contexts


def help_asked(tokens: list[str], collection: Any) -> str | None:
    """The task named before a ``-h`` / ``--help`` in ``tokens`` (``invoke diff -h``), or None."""
    names = {alias: primary for primary, aliases in collection.task_names.items() for alias in (primary, *aliases)}
    task = next((i for i, token in enumerate(tokens) if token in names), None)
    if task is None or not {"-h", "--help"} & set(tokens[task + 1 :]):
        return None
    return names[tokens[task]]


class PreflightProgram(Program):
    """Invoke's program with the task flags' parse errors as one-line usage errors and a checked configuration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("config_class", CheckedConfig)
        super().__init__(*args, **kwargs)

    def _make_parser(self) -> Parser:
        ignore = self.config.tasks.ignore_unknown_help
        return Parser(initial=self.initial_context, contexts=task_contexts(self.collection, ignore))

    def parse_tasks(self) -> None:
        asked = help_asked(list(self.core.unparsed), self.collection)
        if asked:  # a task's positional argument would swallow -h / --help: answer it before parsing
            self.core.unparsed = []
            self.args.help.value = asked
        try:
            super().parse_tasks()
        except (ParseError, ValueError) as exc:
            parser = getattr(self, "parser", None)
            error = usage_error(exc, parser.contexts if parser is not None else ())
            if error is None:
                raise
            raise error from None


def adopt(program: Program) -> None:
    """Make the running ``program`` (and its configuration) the checked kinds; a second call changes nothing.

    Invoke imports ``tasks.py`` inside ``Program.load_collection``: after the core flags are parsed and the system
    and user files are read, before the project file, the task flags, the runtime file and the environment.
    """
    if type(program) is Program:
        program.__class__ = PreflightProgram
    config = getattr(program, "config", None)
    if type(config) is Config:
        config.__class__ = CheckedConfig
