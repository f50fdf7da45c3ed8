"""Task flags declared once: a frozen dataclass per task, one field per flag, made into an Invoke task.

A field is a flag: its name is the flag's (``dry_run`` -> ``--dry-run``, ``from_`` -> ``--from``), its default gives
its type and value, as Invoke reads a task's keyword arguments, and :func:`flag` gives its help. Flags that mean the
same in several tasks are one dataclass that the tasks' dataclasses inherit from. :func:`task` reads the flags class
from the annotation of the task's second parameter and builds an ``invoke.Task`` subclass whose arguments are those
fields; when Invoke calls it, the function receives one instance of the class::

    @dataclass(frozen=True)
    class SnapshotFlags:
        out: str = flag("", "snapshot FILE to write")

    @task()
    def snapshot(c: Context, f: SnapshotFlags) -> None: ...

A field made with :func:`command` is no flag: it receives the words after ``--`` (``invoke verify -- python
train.py``), and only a task that has one accepts them (``checks/cli/program.py`` refuses them for any other).

Every task flag gets the first free letter of its name as a short flag, as Invoke gives them, except ``-h``: after a
task it stays the core help flag (``invoke bootstrap -h`` shows bootstrap's help; ``--hosts`` has no short flag).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from invoke import Context, Task
from invoke.parser import Argument

T = TypeVar("T")
RESERVED_SHORT_FLAGS = frozenset({"h"})


def flag(default: T, help: str) -> T:
    """A dataclass field that is a task flag: its default (whose type the flag takes) and its help line."""
    return dataclasses.field(default=default, metadata={"help": help})


def command() -> tuple[str, ...]:
    """A dataclass field that receives the command after ``--`` as a list of words; empty when there is none."""
    return typing.cast(tuple[str, ...], dataclasses.field(default=(), metadata={"command": True}))


class FlagTask(Task):
    """An Invoke task whose flags are the fields of ``flags`` (a dataclass) and whose body gets one instance of it."""

    def __init__(self, fn: Callable[[Context, Any], None], flags: type, **kwargs: Any) -> None:
        self.flags = flags
        fields = dataclasses.fields(flags)
        self.command_field = next((f.name for f in fields if f.metadata.get("command")), None)

        @functools.wraps(fn)
        def body(c: Context, **values: Any) -> None:
            return fn(c, flags(**values))

        super().__init__(body, **kwargs)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        """One ``Argument`` per flag field, the positional ones first (in their order), as ``Task`` builds them.

        Short flags go to the class's own flags first, then to those of its bases in their order, each the first
        free letter of its name, as Invoke gives them; ``-h`` is then taken off (it stays the help flag)."""
        fields = {f.name: f for f in dataclasses.fields(self.flags) if "help" in f.metadata}
        order = [n for klass in self.flags.__mro__ for n in vars(klass).get("__annotations__", {}) if n in fields]
        taken = {"-", *fields}  # a letter, never the dash of a dashed name
        args = []
        for name in dict.fromkeys(order):
            opts = self.arg_opts(name, typing.cast(str, fields[name].default), taken)  # Invoke's stub: any default
            arg = Argument(**opts, help=fields[name].metadata["help"])
            taken.update(arg.names)
            arg.names = tuple(n for n in arg.names if n not in RESERVED_SHORT_FLAGS)
            args.append(arg)
        first = [a for name in self.positional for a in args if a.name == name]
        return first + [a for a in args if a not in first]


def task(name: str | None = None, positional: Sequence[str] = ()) -> Callable[[Callable[..., None]], FlagTask]:
    """Make ``fn(c, f: SomeFlags)`` an Invoke task named ``name`` (default: the function's name, dashed)."""

    def make(fn: Callable[..., None]) -> FlagTask:
        second = list(inspect.signature(fn).parameters)[1]
        return FlagTask(fn, typing.get_type_hints(fn)[second], name=name, positional=list(positional))

    return make


def fill(cls: type[T], flags: object, **extra: Any) -> T:
    """``cls`` (a package's request dataclass) with every field that ``flags`` also has copied over, and ``extra``."""
    names = {f.name for f in dataclasses.fields(typing.cast(Any, cls))} - set(extra)
    return cls(**{n: getattr(flags, n) for n in names if hasattr(flags, n)}, **extra)
