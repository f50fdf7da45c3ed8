"""Bootstrap's disk measurements, kept for ``invoke stage-data`` to choose where a dataset goes.

A live bootstrap writes what it measured to ``$XDG_CACHE_HOME/gpu-preflight/disks.json`` (``~/.cache`` without
the variable). stage-data reads it back only when it was written since this boot (``boot_id``: disks attached
after a reboot are other disks) and is younger than ``preflight.stage.measured_max_age_h``; otherwise it measures
the candidate folders itself. A missing, old or unreadable file is never an error: it only means "measure now".

Format: ``{"schema": 1, "boot_id", "written_unix", "host", "locations": [LocationFacts fields]}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks import TOOL_NAME
from checks.facts import LocationFacts
from checks.fileio import write_atomic
from checks.probe.host import boot_id

SCHEMA = 1
_FIELDS = {f.name for f in dataclasses.fields(LocationFacts)}


@dataclasses.dataclass(frozen=True)
class Cached:
    """Measured locations and how old they are."""

    locations: tuple[LocationFacts, ...]
    age_s: float


def cache_path(env: dict[str, str] | None = None) -> Path:
    """Where the measurements are kept (XDG base directory rules)."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / TOOL_NAME / "disks.json"


def save(locations: Sequence[LocationFacts], path: Path | None = None) -> Path | None:
    """Keep the measured locations (errors and unmeasured ones left out); None when there was nothing to keep.

    A cache that cannot be written (read-only home, full disk) is skipped silently: bootstrap's report has it all.
    """
    measured = [dataclasses.asdict(x) for x in locations if x.cold_read_mb_s is not None and not x.error]
    if not measured:
        return None
    path = path or cache_path()
    doc = {
        "schema": SCHEMA,
        "boot_id": boot_id(),
        "written_unix": round(time.time(), 3),
        "host": socket.gethostname(),
        "locations": measured,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc, indent=1) + "\n")
    except OSError:
        return None
    return path


def load(max_age_s: float, path: Path | None = None, now: float | None = None) -> Cached | None:
    """Read the measurements back when they are from this boot and at most ``max_age_s`` old; else None."""
    try:
        doc = json.loads((path or cache_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("boot_id") != boot_id():
        return None
    written = doc.get("written_unix")
    age = (time.time() if now is None else now) - written if isinstance(written, (int, float)) else -1.0
    if not 0 <= age <= max_age_s:
        return None
    found = [loc for raw in doc.get("locations") or [] if (loc := _location(raw)) is not None]
    return Cached(tuple(found), age) if found else None


def _location(raw: Any) -> LocationFacts | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        return None
    try:
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in _FIELDS}
        return LocationFacts(**kwargs)
    except TypeError:
        return None
