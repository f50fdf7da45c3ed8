"""A wheelhouse for install tests, built offline: installed distributions of this environment re-packed as wheels.

The test hosts have no package index (and this machine no network), so the wheels pip installs from come from
what this environment already has: each distribution's files (as its RECORD lists them, scripts left out: pip
writes them again from entry_points.txt) zipped with its dist-info and a fresh RECORD.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def repack(name: str, folder: Path) -> Path:
    """Write the installed distribution ``name`` as a wheel into ``folder``; return its path."""
    dist = importlib.metadata.distribution(name)
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f)]
    wheel_meta = next(f for f in files if str(f).endswith(".dist-info/WHEEL"))
    tag = _tag_set(wheel_meta.read_text())
    info_dir = str(wheel_meta).rsplit("/", 1)[0]
    stem = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}"
    path = folder / f"{stem}-{tag}.whl"
    record, rows = f"{info_dir}/RECORD", []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for f in files:
            arc = str(f)
            if arc == record or arc.endswith((".dist-info/INSTALLER", ".dist-info/REQUESTED", "direct_url.json")):
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            whl.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((arc, f"sha256={digest}", str(len(data))))
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([*rows, (record, "", "")])
        whl.writestr(record, out.getvalue())
    return path


def _tag_set(wheel_file: str) -> str:
    """The file-name tag of all the WHEEL file's ``Tag:`` lines (PEP 425's compressed set: ``py2.py3-none-any``).

    The first tag alone would name six, python-dateutil or Deprecated ``py2-none-any``, which pip on Python 3
    refuses as "not a supported wheel on this platform".
    """
    tags = [line.split(":", 1)[1].strip().split("-") for line in wheel_file.splitlines() if line.startswith("Tag:")]
    return "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))


def closure(requirements: tuple[str, ...]) -> list[str]:
    """Name every installed distribution that ``requirements`` need, theirs included (no extras), like
    ``pip download`` would fetch."""
    seen: dict[str, str] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in seen:
            continue
        dist = importlib.metadata.distribution(req.name)
        seen[key] = dist.metadata["Name"]
        todo += [r for r in map(Requirement, dist.requires or []) if not r.marker or r.marker.evaluate({"extra": ""})]
    return sorted(seen.values(), key=str.lower)


def build(requirements: tuple[str, ...], folder: Path) -> list[Path]:
    """Write a wheelhouse for ``requirements`` into ``folder``: every distribution of their closure, re-packed."""
    folder.mkdir(parents=True, exist_ok=True)
    return [repack(name, folder) for name in closure(requirements)]
