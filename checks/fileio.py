"""Files the user names: read as text with one-line errors (``read_text``), and written atomically (a temporary
sibling, fsynced, renamed into place: a reader never sees half a file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from checks.errors import PreflightError


def read_text(
    path: Path, what: str, missing_hint: str | None = None, error: type[PreflightError] = PreflightError
) -> str:
    """The UTF-8 text of a file the user named, or one line naming it (``what``: "lock file") and what went wrong:
    missing (with ``missing_hint``), not text, or not readable (a folder, no permission)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist", hint=missing_hint) from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those this call made, deepest first, for
    ``remove_empty`` once the run is done. The ``OSError`` of a folder that cannot be made (a file in the way, a
    read-only filesystem) is raised after removing any it made on the way."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_empty(made)
        raise
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: what a run made and left nothing in."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (the run's output, or another run's), or already gone
            return


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` atomically; ``mode`` defaults to the existing file's, else 0o644."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
