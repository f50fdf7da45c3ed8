"""Typed JSON: frozen dataclasses to plain JSON and back. Standard library only (verify's training child imports it).

One reader and one writer for every typed document the tool reads back: machine snapshots (``checks.snapshot``),
reports (``checks.result.Report``, verify's ``checks.reports.verify.Measurements``) and the records that cross
verify's process boundary (``checks.verify.contract``). ``Record`` is the base of those records: a frozen
dataclass with ``to_json`` and ``from_json`` (a mismatch is a ``ContractError`` naming the record and the key).

- ``dump(value)``: dataclasses to objects (a field named in the class's ``OMIT_NONE`` is left out when None; a
  nested value with its own ``to_json`` is written by it), tuples to lists, dict keys to strings.
- ``load(hint, value, where)``: ``value`` rebuilt as the type ``hint`` names: a class with its own ``from_json``
  by it, dataclasses (a missing field takes its default; an unknown key is an error), tuples (fixed length or ``tuple[T, ...]``), ``dict[str, T]`` (each
  value as ``T``), optionals, ``Any`` (as it is), enums (by value), and scalars (an int passes as a float; a bool
  never passes as an int). A mismatch raises ``TypedJsonError`` whose message starts with the path to the bad value
  (``machine.host.cpu_governors.powersave: expected int, got '8'``); callers turn it into their own error. The
  reader of each hint (and each record's field readers) is worked out once and kept: a fleet of a thousand hosts
  reads the same records a thousand times.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, ClassVar, TypeVar, Union

JsonObject = dict[str, Any]  # figures kept as the producer wrote them (their keys: where they are measured)
R = TypeVar("R", bound="Record")


class TypedJsonError(ValueError):
    """A JSON value that is not of the type asked for; the message names the path to it. For an unknown key,
    ``known`` lists the keys the record has (the caller says them where its reader looks: a hint, a log line)."""

    def __init__(self, message: str, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.known = known


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def dump_fields(record: Any) -> dict[str, Any]:
    """A dataclass instance as a JSON object (``OMIT_NONE`` fields left out when None)."""
    omit: frozenset[str] = getattr(record, "OMIT_NONE", frozenset())
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None and f.name in omit:
            continue
        out[f.name] = dump(value)
    return out


def dump(value: Any) -> Any:
    """``value`` in plain JSON types (see the module docstring)."""
    own = getattr(value, "to_json", None)
    if callable(own) and not isinstance(value, type):
        return own()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dump_fields(value)
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    return value


_PLANS: dict[type, tuple[frozenset[str], dict[str, Loader]]] = {}


def load_record(cls: type, data: Any, where: str) -> Any:
    """A dataclass ``cls`` from its JSON object."""
    if not isinstance(data, Mapping):
        raise TypedJsonError(f"{where}: expected a JSON object, got {type(data).__name__}")
    plan = _PLANS.get(cls)
    if plan is None:
        hints = _hints(cls)
        names = frozenset(f.name for f in dataclasses.fields(cls))
        plan = _PLANS[cls] = (names, {name: _loader_of(hints[name]) for name in names})
    names, loaders = plan
    if not names.issuperset(data):
        unknown = sorted(set(data) - names)
        raise TypedJsonError(f"{where}: unknown key {unknown[0]!r}", known=tuple(sorted(names)))
    kwargs = {k: loaders[k](v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required key is missing
        raise TypedJsonError(f"{where}: {exc}") from None


def load(hint: Any, value: Any, where: str) -> Any:
    """``value`` as the type ``hint`` names (see the module docstring)."""
    return _loader_of(hint)(value, where)


Loader = typing.Callable[[Any, str], Any]  # (value, where) -> the value as its hint names it
_LOADERS: dict[Any, Loader] = {}
_EXACT: dict[Any, type] = {str: str, bool: bool, int: int}  # a value of exactly this type is the value itself


def _loader_of(hint: Any) -> Loader:
    """The reader of ``hint``'s values, worked out once per hint: a report of a thousand hosts reads the same
    few hundred hints over and over (working each out on every value took most of a fleet report's build)."""
    try:
        return _LOADERS[hint]
    except KeyError:
        loader = _LOADERS[hint] = _make_loader(hint)
        return loader
    except TypeError:  # a hint that cannot be a key
        return _make_loader(hint)


def _make_loader(hint: Any) -> Loader:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        nullable = type(None) in args
        rest = [a for a in args if a is not type(None)]
        inner = _loader_of(rest[0] if len(rest) == 1 else Any)

        def union(value: Any, where: str) -> Any:
            return None if value is None and nullable else inner(value, where)

        return union
    if hint is Any:
        return lambda value, where: value
    if isinstance(hint, type) and "from_json" in vars(hint):  # its JSON is not its fields (``Report``)
        own = typing.cast(Any, hint).from_json
        return lambda value, where: own(value, where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda value, where: load_record(hint, value, where)
    if origin is tuple:
        return _tuple_loader(args)
    if origin is dict:
        item, exact = _loader_of(args[1]), _EXACT.get(args[1])

        def mapping(value: Any, where: str) -> Any:
            if not isinstance(value, Mapping):
                raise TypedJsonError(f"{where}: expected a JSON object, got {type(value).__name__}")
            if exact is not None and all(type(v) is exact for v in value.values()):  # a package list, at once
                return {str(k): v for k, v in value.items()}
            return {str(k): item(v, f"{where}.{k}") for k, v in value.items()}

        return mapping
    if hint in _EXACT:  # the exact type passes at once; anything else as _scalar says
        return lambda value, where: value if type(value) is hint else _scalar(hint, value, where)
    if hint is float:
        return lambda value, where: float(value) if type(value) in (float, int) else _scalar(hint, value, where)
    return lambda value, where: _scalar(hint, value, where)


def _tuple_loader(args: tuple[Any, ...]) -> Loader:
    if len(args) == 2 and args[1] is Ellipsis:
        item, exact = _loader_of(args[0]), _EXACT.get(args[0])

        def many(value: Any, where: str) -> Any:
            if not isinstance(value, (list, tuple)):
                raise TypedJsonError(f"{where}: expected a list, got {type(value).__name__}")
            if exact is not None and all(type(v) is exact for v in value):
                return tuple(value)
            return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

        return many
    items = [_loader_of(a) for a in args]

    def fixed(value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise TypedJsonError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) != len(value):
            raise TypedJsonError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(f(v, f"{where}[{i}]") for i, (f, v) in enumerate(zip(items, value, strict=True)))

    return fixed


def _scalar(hint: Any, value: Any, where: str) -> Any:
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            known = ", ".join(str(m.value) for m in hint)
            raise TypedJsonError(f"{where}: expected one of {known}, got {value!r}"[:300]) from None
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint not in (int, float) and isinstance(hint, type) and isinstance(value, hint):
        return value
    raise TypedJsonError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}"[:300])


class ContractError(TypedJsonError):
    """A JSON document that is not the record it should be; the message names the record and the key."""


class Record:
    """A frozen dataclass that converts to and from its JSON object: ``dump_fields`` and ``load_record``; keys in
    its ``OMIT_NONE`` are left out of its JSON when None, as the producer leaves them out."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> JsonObject:
        return dump_fields(self)

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        try:
            return typing.cast(R, load_record(cls, data, where or cls.__name__))
        except TypedJsonError as exc:
            known = f" (known: {', '.join(exc.known)})" if exc.known else ""
            raise ContractError(f"{exc}{known}") from None
