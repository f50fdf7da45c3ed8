"""gpu-preflight's own Invoke program: flag and configuration mistakes are one line and exit 2.

``invoke TASK`` is Invoke's own program (``invoke.main.program``): it finds tasks.py and executes it while loading
the collection. tasks.py ends with :func:`take_over`, which from there runs the whole command line with
:class:`PreflightProgram` (Invoke's ``Program``, built with its public constructor over tasks.py's collection) and
ends the process with that program's exit code; imported any other way (the tests, ``import tasks``) it does
nothing. Invoke's parser has no public hook for the task flags' errors, so the project ships its own program and
keeps Invoke's for finding it. ``PreflightProgram`` overrides documented steps of ``Program`` only:

- ``core_args`` keeps ``-c`` / ``-r`` / ``--no-dedupe`` (Invoke's own program found tasks.py with them);
- ``parse_collection`` also loads the checkout's ``invoke.yaml`` (Invoke loads a project file only for a
  collection it found on disk itself);
- ``parse_tasks``: Invoke rejects an unknown flag or stray word with ``ParseError("No idea what '--jsn' is!")``
  (exit 1, not naming the task), a value flag given last with ``ParseError("Flag <Argument: json (j)> needed value
  ...")``, and lets a value its flag's type cannot cast (``--steps abc``) escape as a ``ValueError`` traceback.
  Each becomes a ``PreflightError`` naming the task and the flag, with the closest real flag or task and the
  ``invoke --help TASK`` that lists them. The words after ``--`` go to the task whose flags declare a command
  (:func:`checks.cli.flags.command`); any other task refuses them;
- ``run`` prints a ``PreflightError`` from any step (configuration, parsing, a task's body) as its one line and
  exits with its code. The library raises plain exceptions; this is the one place they become exit codes.

Its configuration is a :class:`CheckedConfig`, which validates each source just before Invoke loads it:

- the configuration files (``load_project`` / ``load_runtime``): each ``preflight`` section is validated before
  Invoke merges it (a value where a section belongs, or a YAML error, is a traceback in Invoke), and a ``-f`` /
  ``INVOKE_RUNTIME_CONFIG`` file that does not exist is an error (Invoke goes on without it, and without saying
  so);
- the ``INVOKE_PREFLIGHT_*`` variables (``load_shell_env``): Invoke casts the string to the default's type, so a
  bad number would end in a traceback, an unknown name is silently ignored, and a boolean is true for any value
  but "0" and "" ("false" would mean true). All three are caught first.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import os
import re
import sys
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import invoke
import invoke.main
from invoke import Collection, Config, Program
from invoke.exceptions import ParseError
from invoke.parser import Argument, Parser, ParserContext, to_flag

from checks import TOOL_NAME, TOOL_VERSION
from checks.config import load_defaults, validate_files
from checks.errors import PreflightError
from checks.hostlist import has_password, password_error

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
    if has_password(token):  # a host with its password (the --hosts flag forgotten): refused, never echoed
        return password_error(token)
    if token.startswith("-"):
        flags = [f for f in context.flag_names() if f.startswith("--")] if context is not None else []
        if task:
            return PreflightError(f"{task} has no flag {token}", hint=_hint(task, _closest(token, flags)))
        hint = (f"did you mean {close}? " if (close := _closest(token, flags)) else "") + "`invoke --help` lists them"
        return PreflightError(f"invoke has no flag {token}", hint=hint)
    close = _closest(token, tasks)
    if close or not task:
        return PreflightError(f"no task named {token!r}", hint=_hint(None, close))
    return PreflightError(f"unexpected argument {token!r} after {task}", hint=_positional_hint(task, token, context))


# A word after a task that takes none: what the user most likely meant. The tasks that run the user's own command
# take it after `--`; the others name their main input with a flag (each is checked against the task's flags).
_AFTER_DASHES = ("verify", "sbatch")
_SWITCH_WORDS = ("true", "false", "yes", "no", "on", "off", "0", "1")
INPUT_FLAGS = {"stage-data": "--source", "bootstrap": "--hosts", "watch": "--pid", "plan": "--model"}


def _positional_hint(task: str, token: str, context: ParserContext | None) -> str:
    if token.lower() not in _SWITCH_WORDS:  # `--ab yes`: a value given to a switch, in any task
        if task in _AFTER_DASHES:
            return f"your own command goes after --: invoke {task} -- {token} ...; " + _help(task)
        flag = INPUT_FLAGS.get(task)
        if flag and context is not None and flag in context.flag_names():
            return f"did you mean {flag} {token}? " + _help(task)
    return "on/off flags take no value; " + _help(task)


def usage_error(exc: Exception, tasks: Iterable[str]) -> PreflightError | None:
    """The one-line usage error for a ``ParseError`` from parsing the task flags; None for any other exception."""
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


def cast_error(initial: ParserContext, contexts: list[ParserContext], tokens: list[str]) -> PreflightError | None:
    """The usage error for the first value in ``tokens`` that its flag's type cannot cast; None when none fails.

    Invoke casts a value while it parses and lets the ``ValueError`` go without the flag. Parsed again with every
    number flag of ``contexts`` taking text, the same tokens show which flag and value it was.
    """
    kinds: dict[tuple[str | None, str | None], type] = {}
    for context in contexts:
        for arg in context.args.values():
            if arg.kind in _KINDS:
                kinds[context.name, arg.name], arg.kind = arg.kind, str
    try:
        parsed = Parser(initial=initial, contexts=contexts).parse_argv(tokens)
    except ParseError as exc:  # a later mistake on the same line
        return usage_error(exc, [c.name for c in contexts if c.name])
    for context in parsed[1:]:
        for arg in context.args.values():
            kind = kinds.get((context.name, arg.name))
            if kind is None or not arg.got_value:
                continue
            try:
                kind(arg.value)
            except ValueError:
                flag = f"{context.name} {to_flag(arg.name or '')}"
                return PreflightError(f"{flag} takes {_KINDS[kind]}, not {arg.value!r}", hint=_help(context.name))
    return None


def help_asked(tokens: list[str], collection: Any) -> str | None:
    """The task named before a ``-h`` / ``--help`` in ``tokens`` (``invoke diff -h``), or None."""
    names = {alias: primary for primary, aliases in collection.task_names.items() for alias in (primary, *aliases)}
    task = next((i for i, token in enumerate(tokens) if token in names), None)
    if task is None or not {"-h", "--help"} & set(tokens[task + 1 :]):
        return None
    return names[tokens[task]]


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


def runtime_file_problem(path: str | None) -> PreflightError | None:
    """The error for a runtime configuration file (``-f`` or ``INVOKE_RUNTIME_CONFIG``) that does not exist, or
    whose name Invoke cannot read (it picks the parser by the suffix, and raises a traceback for any other)."""
    if not path:
        return None
    file = Path(os.path.expanduser(path))
    if not file.exists():
        return PreflightError(
            f"configuration file {file} does not exist",
            hint="fix the path given with -f / --config / INVOKE_RUNTIME_CONFIG",
        )
    if file.suffix.lstrip(".") not in (*_SUFFIXES, "py"):
        return PreflightError(
            f"configuration file {file} has no .yaml, .yml or .json suffix, which Invoke needs to read it",
            hint=f"give it one, as in {file.stem}.yaml",
        )
    return None


LOOKALIKE_NAMES = ("invoke", "preflight", "gpu-preflight", ".invoke", ".preflight")


def lookalikes(read: Iterable[Path], project: str | None, here: Path | None = None) -> list[str]:
    """One warning per file in the current folder or the project's (tasks.py's) that looks like this tool's
    configuration but is not among those ``read``: an ``invoke.yaml`` in the user's own project while tasks.py is
    found with ``invoke -r CHECKOUT``, a ``preflight.yaml`` (a name Invoke never reads)."""
    read_now = {p.resolve() for p in read}
    folders = dict.fromkeys(f.resolve() for f in (here or Path.cwd(), Path(project) if project else None) if f)
    shown = ", ".join(_home(p) for p in read) or "none (the defaults and INVOKE_PREFLIGHT_* variables apply)"
    out = []
    for folder in folders:
        for name in LOOKALIKE_NAMES:
            for suffix in _SUFFIXES:
                path = folder / f"{name}.{suffix}"
                if path.is_file() and path.resolve() not in read_now:
                    out.append(
                        f"gpu-preflight: warning: {_home(path)} is not read; configuration files read: {shown} "
                        "(Invoke reads invoke.yaml beside tasks.py, ~/.invoke.yaml, /etc/invoke.yaml and -f FILE)"
                    )
    return out


def _home(path: Path) -> str:
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


INVOKE_KEYS = tuple(Config.global_defaults())  # run, runners, sudo, tasks, timeouts in Invoke 2.2


class CheckedConfig(Config):
    """Invoke's configuration, each source validated just before Invoke loads, merges or casts it."""

    # Real attributes, not settings: Invoke's Config makes setting any name it does not have a configuration change.
    checked_prefixes: tuple[str | None, ...] = ()
    checked_project: str | None = None
    checked_runtime: str | None = None

    def __init__(self, system_prefix: str | None = None, user_prefix: str | None = None, **kwargs: Any) -> None:
        # Invoke's defaults for the two prefixes (documented: /etc/invoke.yaml, ~/.invoke.yaml)
        system = system_prefix if system_prefix is not None or os.name == "nt" else "/etc/"
        self.checked_prefixes = (system, "~/." if user_prefix is None else user_prefix)
        super().__init__(system_prefix=system_prefix, user_prefix=user_prefix, **kwargs)

    def files_at(self, prefix: str | None) -> list[Path]:
        """The data files Invoke reads for ``prefix`` (``~/.`` gives ~/.invoke.yaml, .yml and .json)."""
        stem = (prefix or "") + (self.file_prefix or self.prefix)
        return [Path(os.path.expanduser(f"{stem}.{suffix}")) for suffix in _SUFFIXES] if prefix else []

    def set_project_location(self, path: str | os.PathLike[str] | None) -> None:
        """Invoke's step; the folder is kept for :meth:`load_project`."""
        self.checked_project = None if path is None else os.path.join(path, "")
        super().set_project_location(path)

    def set_runtime_path(self, path: str | os.PathLike[str] | None) -> None:
        """Invoke's step; the path is kept for :meth:`load_runtime`."""
        self.checked_runtime = None if path is None else os.fspath(path)
        super().set_runtime_path(typing.cast(Any, path))  # Invoke passes the text of -f / INVOKE_RUNTIME_CONFIG

    def load_project(self, merge: bool = True) -> None:
        """Validate the system, user and project files (the project's is loaded next), then load it; warn once about
        a configuration file next to them that is not read (see :func:`lookalikes`)."""
        shared = [path for prefix in self.checked_prefixes for path in self.files_at(prefix)]
        validate_files(shared, INVOKE_KEYS, own=False)  # these may serve other Invoke projects too
        validate_files(self.files_at(self.checked_project), INVOKE_KEYS)
        super().load_project(merge=merge)
        for line in lookalikes(self.read_files(), self.checked_project):
            print(line, file=sys.stderr)

    def read_files(self) -> list[Path]:
        """The configuration files Invoke reads for this run that exist: system, user, project, runtime (-f)."""
        places = [*self.checked_prefixes, self.checked_project]
        found = [path for prefix in places for path in self.files_at(prefix) if path.is_file()]
        runtime = Path(os.path.expanduser(self.checked_runtime)) if self.checked_runtime else None
        return found + ([runtime] if runtime is not None and runtime.is_file() else [])

    def load_runtime(self, merge: bool = True) -> None:
        """Refuse a runtime file that does not exist and validate the one that does, then load it."""
        path = self.checked_runtime
        if error := runtime_file_problem(path):
            raise error
        if path:
            validate_files([Path(os.path.expanduser(path))], INVOKE_KEYS)
        super().load_runtime(merge=merge)

    def load_shell_env(self) -> None:
        """Validate the ``INVOKE_PREFLIGHT_*`` variables, then let Invoke cast and load them."""
        check_env_overrides(os.environ, load_defaults())
        super().load_shell_env()


# --- the program ------------------------------------------------------------------------------------------


def with_placeholder(names: str, numbers: set[str]) -> str:
    """``-p, --price-per-hour`` as ``-p NUM, --price-per-hour=NUM`` when those flags take a float."""
    parts = [n + (" NUM" if n.count("-") == 1 and len(n) == 2 else "=NUM") if n in numbers else n
             for n in names.split(", ")]  # fmt: skip
    return ", ".join(parts)


class PreflightProgram(Program):
    """Invoke's program with one-line usage errors, a checked configuration and the command after ``--``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("config_class", CheckedConfig)
        kwargs.setdefault("version", VERSION)
        super().__init__(*args, **kwargs)
        self.numbers: set[str] = set()  # the float flags of the task whose help is being printed
        self.config_error: PreflightError | None = None  # a configuration file's mistake, raised once a task runs

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        """Invoke's run; a ``PreflightError`` from any step is its one line on stderr and its exit code."""
        try:
            super().run(argv, exit)
        except PreflightError as error:
            print(error, file=sys.stderr)
            if exit:
                sys.exit(error.code)

    def core_args(self) -> list[Argument]:
        """Invoke's core flags, with the ones that find tasks.py (``-c``, ``-r``, ``--no-dedupe``) kept.

        Invoke's own program has used ``-c`` / ``-r`` to find tasks.py (``invoke -r CHECKOUT verify``); Invoke drops
        them for a program given its collection, which would refuse the command line they are on."""
        args: list[Argument] = super().core_args()
        return args + self.task_args() if self.namespace is not None else args

    def task_list_opener(self, extra: str = "") -> str:
        """``invoke --list``'s heading as Invoke writes it for a collection it found (not "Subcommands"), with
        gpu-preflight's version: ``invoke --version`` is Invoke's own, answered before tasks.py is loaded."""
        return f"Available tasks ({'; '.join(filter(None, [extra, f'{TOOL_NAME} {TOOL_VERSION}']))})"

    def parse_collection(self) -> None:
        """Invoke's step, and the project file of a collection given to the program (Invoke skips it then).

        A mistake in a configuration file waits for :meth:`update_config`, the step after ``--list`` and ``--help``
        have been answered: they keep working, so the task names and flags stay readable."""
        super().parse_collection()
        if self.namespace is not None and self.collection.loaded_from:
            self.config.set_project_location(self.collection.loaded_from)
            try:
                self.config.load_project()
            except PreflightError as error:
                self.config_error = error

    def update_config(self, merge: bool = True) -> None:
        """Invoke's step (the runtime file, the flags' overrides), once a task is to run: a configuration file's
        mistake held back by :meth:`parse_collection` stops it here."""
        if self.config_error is not None:
            raise self.config_error
        super().update_config(merge=merge)

    def parse_tasks(self) -> None:
        """Invoke's step with its parse errors as usage errors; then hand the command after ``--`` to its task."""
        asked = help_asked(list(self.core.unparsed), self.collection)
        if asked:  # a task's positional argument would swallow -h / --help: answer it before parsing
            self.core.unparsed = []
            self.args.help.value = asked
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise usage_error(exc, self.parser.contexts) or exc from None
        except ValueError:
            ignore = self.config.tasks.ignore_unknown_help
            contexts = self.collection.to_contexts(ignore_unknown_help=ignore)
            error = cast_error(self.initial_context, contexts, list(self.core.unparsed))
            if error is None:
                raise  # a ValueError from somewhere else (a broken task definition): keep its traceback
            raise error from None
        self.give_command()

    def print_task_help(self, name: str) -> None:
        """Invoke's task help, with ``NUM`` after the flags that take a number with a fraction (Invoke writes a
        placeholder for ``INT`` and ``STRING`` only, so ``--price-per-hour`` looked like a switch), and for a task
        that runs a command the ``-- COMMAND`` form under Invoke's usage line (which has no place for it)."""
        ctx = self.parser.contexts[name]
        self.numbers = {n for flag, arg in ctx.flags.items() if arg.kind is float for n in ctx.names_for(flag)}
        text = io.StringIO()
        try:
            with contextlib.redirect_stdout(text):
                super().print_task_help(name)
        finally:
            self.numbers = set()
        usage, _, rest = text.getvalue().partition("\n")
        dashes = f"\n       invoke {name} [flags] -- COMMAND ...  (your own command, run and judged)"
        sys.stdout.write(usage + (dashes if command_field(self.collection[name]) else "") + "\n" + rest)

    def print_columns(self, tuples: Sequence[tuple[str, str | None]]) -> None:
        super().print_columns([(with_placeholder(names, self.numbers), text) for names, text in tuples])

    def command(self) -> list[str]:
        """The words after the first ``--``, one per argument as the shell passed them.

        Invoke's ``core.remainder`` holds the same words joined by spaces, which loses where each one ends."""
        words = self.argv[1:]
        return words[words.index("--") + 1 :] if "--" in words else []

    def give_command(self) -> None:
        """Put the words after ``--`` in the command field of each task to run; refuse them for a task without one,
        and a ``--`` with nothing after it for a task with one (it would run the tool's own script without a word)."""
        words = self.command()
        for context in self.tasks if "--" in self.argv[1:] else ():
            field = command_field(self.collection[context.name])
            if field is not None and not words:
                hint = f"e.g. invoke {context.name} -- python train.py"
                raise PreflightError(f"{context.name}: {NOTHING_AFTER_DASHES}", hint=hint)
            if not words:
                continue
            if field is None:
                takers = [n for n in self.collection.task_names if command_field(self.collection[n])]
                runs = " or ".join(f"`invoke {n} [flags] -- COMMAND`" for n in takers) or "no task"
                hint = f"only {runs} runs a command; " + _help(context.name)
                raise PreflightError(f"{context.name} takes no command after --", hint=hint)
            context.add_arg(Argument(name=field, default=tuple(words)))


NOTHING_AFTER_DASHES = (
    "nothing after --: put your training command after it, or drop -- to run the tool's own training script"
)


def command_field(task: Any) -> str | None:
    """The flags field that receives the words after ``--`` (``checks.cli.flags.command``), or None for a task without."""
    return getattr(task, "command_field", None)


# what --version prints: gpu-preflight's own version (pyproject.toml's, which a test holds checks.TOOL_VERSION to),
# and Invoke's, which parses the command line
VERSION = f"{TOOL_VERSION} (Invoke {invoke.__version__})"


def take_over(namespace: Collection) -> None:
    """When Invoke's own program is loading tasks.py, run its command line with :class:`PreflightProgram` and exit.

    ``invoke.main.program`` (the ``invoke`` command) sets its ``argv`` first and its ``collection`` only once
    tasks.py has run: between the two it is loading this collection. The process then ends here, with the exit code
    of the project's program, so Invoke's own goes no further.
    """
    stock = invoke.main.program
    if not stock.argv or hasattr(stock, "collection"):
        return
    names = {"name": TOOL_NAME, "binary": stock.binary, "binary_names": stock.binary_names}
    PreflightProgram(namespace=namespace, **names).run(stock.argv)
    raise SystemExit(0)
