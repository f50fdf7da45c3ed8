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

import json
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from checks import TOOL_NAME, TOOL_VERSION
from checks.errors import SnapshotError
from checks.facts import MachineFacts
from checks.fileio import read_text, write_atomic
from checks.typedjson import TypedJsonError, dump, load

SNAPSHOT_SCHEMA = 1


def machine_from_dict(data: dict[str, Any], where: str = "machine") -> MachineFacts:
    """Rebuild ``MachineFacts`` from the ``machine`` object of a snapshot (with ``checks.typedjson``)."""
    try:
        return typing.cast(MachineFacts, load(MachineFacts, data, where))
    except TypedJsonError as exc:
        raise SnapshotError(str(exc), hint=f"known: {', '.join(exc.known)}" if exc.known else None) from None


def dump_snapshot(facts: MachineFacts, *, recorded: bool, description: str = "") -> dict[str, Any]:
    """Return the snapshot document for ``facts``."""
    return {
        "snapshot": SNAPSHOT_SCHEMA,
        "tool": f"{TOOL_NAME} {TOOL_VERSION}",
        "recorded": recorded,
        "description": description,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": dump(facts),
    }


def load_snapshot(path: Path) -> tuple[MachineFacts, dict[str, Any]]:
    """Read a snapshot file; return the facts and the document's header fields."""
    text = read_text(path, "machine snapshot", "record one with `invoke snapshot --out FILE`", SnapshotError)
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
