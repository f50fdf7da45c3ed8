"""Unpack .tar, .tar.gz/.tgz and .zip safely: no member may land outside the destination, links are refused.

Members are written by this code (never ``extractall``): a name that is absolute or climbs with ``..`` stops the
extraction (the archive is hostile or broken); symbolic and hard links, devices and FIFOs are skipped and
listed. The caller extracts into a scratch folder and renames it when done, so a kill restarts the unpacking.
"""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from checks.units import MIB
from datasets.errors import UsageError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
Progress = Callable[[int], None]


def is_archive(name: str) -> bool:
    """Tell whether ``name`` ends like an archive this module unpacks."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def stem(name: str) -> str:
    """Return the archive's name without its archive suffix."""
    lower = name.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name


def extract(archive: Path, dest: Path, progress: Progress) -> list[tuple[str, str]]:
    """Extract ``archive`` into the empty folder ``dest``; return the (member, reason) pairs skipped."""
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.lower().endswith(".zip"):
        return _extract_zip(archive, dest, progress)
    return _extract_tar(archive, dest, progress)


def safe_target(dest: Path, name: str) -> Path:
    """Map a member name to its path under ``dest``; raise for names that would escape it."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise UsageError(f"archive member {name!r} would land outside the destination; refusing to extract")
    return dest.joinpath(*[p for p in pure.parts if p != "."])


def _extract_tar(archive: Path, dest: Path, progress: Progress) -> list[tuple[str, str]]:
    skipped: list[tuple[str, str]] = []
    done = 0
    try:
        with tarfile.open(archive, "r|*") as tar:  # streaming: one pass over a compressed archive
            for member in tar:
                target = safe_target(dest, member.name)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    src = tar.extractfile(member)
                    assert src is not None
                    _write(src, target, member.mtime)
                    done += member.size
                    progress(done)
                else:
                    skipped.append((member.name, _tar_kind(member)))
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise UsageError(f"archive {archive} is damaged or not a tar file: {exc}") from None
    return skipped


def _extract_zip(archive: Path, dest: Path, progress: Progress) -> list[tuple[str, str]]:
    skipped: list[tuple[str, str]] = []
    done = 0
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                target = safe_target(dest, info.filename)
                mode = info.external_attr >> 16
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # zip stores a Unix file type for links
                    skipped.append((info.filename, "link or special file refused"))
                else:
                    with zf.open(info) as src:
                        _write(src, target, _zip_mtime(info))
                    done += info.file_size
                    progress(done)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise UsageError(f"archive {archive} is damaged or not a zip file: {exc}") from None
    return skipped


def _write(src: IO[bytes], target: Path, mtime: float) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise UsageError(f"archive member {target.name!r} collides with a folder or link; refusing to extract")
    with target.open("wb") as out:
        shutil.copyfileobj(src, out, MIB)
    os.utime(target, (mtime, mtime))


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return f"link refused (to {member.linkname!r})"
    return "special file refused (device or FIFO)"


def _zip_mtime(info: zipfile.ZipInfo) -> float:
    return datetime.datetime(*info.date_time, tzinfo=datetime.timezone.utc).timestamp()
