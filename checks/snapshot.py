"""Machine snapshots: a recorded machine's facts as JSON, written by ``invoke snapshot`` and replayed by
``invoke bootstrap --machine FILE``.

Format (``"snapshot": 1``)::

    {
      "snapshot": 1,                       # format version; a newer one is refused, not guessed at
      "tool": "gpu-preflight 0.1.0",       # who wrote it
      "recorded": true,                    # true: read off a real machine; false: hand-written
      "description": "...",                # free text: what the machine is / what the file shows
      "created": "2026-11-29T15:00:00Z",
      "machine": {
        "nvml":  {...NvmlFacts, "gpus": [{...GpuFacts}, ...]},
        "torch": {...TorchFacts},
        "host":  {...HostFacts},
        "bench": {...BenchFacts} | null,   # optional recorded GPU micro-benchmarks
        "alloc": {...AllocFacts} | null,   # optional recorded allocator read-back
        "env":   {...EnvFacts} | null,     # OS, glibc, nvcc, CPU flags, packages, variables; null in older files
        "topology": {...TopologyFacts} | null,  # GPU pairs' paths, P2P status, NUMA, interfaces; null in older files
        "p2p": {...P2PFacts} | null,             # optional recorded device-to-device copy matrix
        "allreduce_local": {...LocalAllreduceFacts} | null  # optional recorded all-reduce over the box's GPUs
      }
    }

Field names and units are those of ``checks/facts.py``. Missing fields take their defaults (so an old or
hand-written file stays readable); unknown fields are an error naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from checks import TOOL_NAME, TOOL_VERSION
from checks.errors import SnapshotError
from checks.facts import MachineFacts
from checks.fileio import write_atomic

SNAPSHOT_SCHEMA = 1


def to_jsonable(value: Any) -> Any:
    """Turn a facts record (nested dataclasses, tuples) into plain JSON types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def _build(tp: Any, data: Any, where: str) -> Any:
    """Rebuild a value of type ``tp`` from JSON data, naming ``where`` on mismatch."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _build(args[0], data, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected an object, got {type(data).__name__}")
        return _build_record(tp, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise SnapshotError(f"{where}: expected a list, got {type(data).__name__}")
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_build(items[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(items) != len(data):
            raise SnapshotError(f"{where}: expected {len(items)} items, got {len(data)}")
        return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(items, data, strict=True)))
    if origin is dict:
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected an object, got {type(data).__name__}")
        return {str(k): str(v) for k, v in data.items()}
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
        raise SnapshotError(f"{where}: expected {tp.__name__}, got {type(data).__name__} {data!r}")
    return data


def _build_record(cls: Any, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SnapshotError(f"{where}: unknown field {unknown[0]!r}", hint=f"known: {', '.join(sorted(names))}")
    kwargs = {k: _build(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise SnapshotError(f"{where}: {exc}") from None


def machine_from_dict(data: dict[str, Any], where: str = "machine") -> MachineFacts:
    """Rebuild ``MachineFacts`` from the ``machine`` object of a snapshot."""
    return typing.cast(MachineFacts, _build(MachineFacts, data, where))


def dump_snapshot(facts: MachineFacts, *, recorded: bool, description: str = "") -> dict[str, Any]:
    """Return the snapshot document for ``facts``."""
    return {
        "snapshot": SNAPSHOT_SCHEMA,
        "tool": f"{TOOL_NAME} {TOOL_VERSION}",
        "recorded": recorded,
        "description": description,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": to_jsonable(facts),
    }


def load_snapshot(path: Path) -> tuple[MachineFacts, dict[str, Any]]:
    """Read a snapshot file; return the facts and the document's header fields."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SnapshotError(
            f"machine snapshot {path} does not exist", hint="record one with `invoke snapshot --out FILE`"
        ) from None
    except UnicodeDecodeError:
        raise SnapshotError(f"machine snapshot {path} is not UTF-8 text") from None
    except OSError as exc:
        raise SnapshotError(f"machine snapshot {path} cannot be read: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"machine snapshot {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("machine"), dict):
        raise SnapshotError(
            f"machine snapshot {path} has no 'machine' object", hint="is this a bootstrap report instead?"
        )
    schema = doc.get("snapshot")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise SnapshotError(f"machine snapshot {path} has no valid 'snapshot' version")
    if schema > SNAPSHOT_SCHEMA:
        raise SnapshotError(
            f"machine snapshot {path} has format {schema}, newer than this tool's {SNAPSHOT_SCHEMA}",
            hint="update gpu-preflight (git pull) to read it",
        )
    facts = machine_from_dict(doc["machine"], where=f"{path.name}: machine")
    header = {k: v for k, v in doc.items() if k != "machine"}
    return facts, header


def write_snapshot(path: Path, document: dict[str, Any]) -> None:
    """Write a snapshot atomically: a temporary sibling renamed into place."""
    write_atomic(path, json.dumps(document, indent=2, sort_keys=False) + "\n")
