"""The staging folder beside a destination: the folders a run makes, publishing by rename, and what a run leaves.

A run leaves the dataset, or a staging folder worth resuming (a journal that records work, or fetched bytes), and
nothing else: no folder it made that stayed empty, no staging folder with nothing in it to resume.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from checks.fileio import make_folders, remove_empty
from datasets.errors import UsageError
from datasets.finalize import fsync_dir
from datasets.journal import Journal


@contextmanager
def made_folders(dest: Path) -> Iterator[None]:
    """Create the folder of ``dest`` and its missing parents; remove those still empty when the run ends (a failed
    run); one that cannot be made is a usage error (exit 2)."""
    folder = dest.parent
    try:
        made = make_folders(folder)
    except OSError as exc:  # a file in the way, a read-only or vanished filesystem
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file" if blocker else f"{exc.filename or folder}: {exc.strerror or exc}"
        raise UsageError(
            f"--dest {dest}: cannot create its folder: {why}", hint="give --dest a path under a folder you can write"
        ) from None
    try:
        yield
    finally:
        remove_empty(made)  # one that is not empty holds the dataset, or another run's


def drop_if_empty(work: Path) -> None:
    """Remove a staging folder that holds nothing to resume: a journal with only its start, an empty out/."""
    journal = Journal(work / "journal.jsonl")
    if [e["event"] for e in journal.events] != ["start"]:
        return
    if sorted(p.name for p in work.iterdir()) == ["journal.jsonl", "out"] and not any((work / "out").iterdir()):
        shutil.rmtree(work, ignore_errors=True)


def publish(out: Path, dest: Path, work: Path) -> None:
    """Swap the finished folder in by rename; the old version is moved aside first, then removed."""
    fsync_dir(out)
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    out.rename(dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def clean_leftovers(dest: Path, work: Path) -> None:
    """Remove what a run killed after publishing left behind."""
    journal = Journal(work / "journal.jsonl")
    if work.exists() and journal.has("ready") and not (work / "out").exists():
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dest.with_name(f".{dest.name}.old"), ignore_errors=True)
