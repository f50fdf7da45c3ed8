"""What ``--source`` names, what identifies its current version, and getting it onto local disk.

A local folder is read where it is (each file is read once while decoding, network mounts included); a local
archive is unpacked into the staging folder; ``host:/path`` is copied with rsync over SSH; an http(s) URL is
downloaded (resumed with Range, sha256-checked when given) and unpacked when it is an archive.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import requests

from checks.probe.net import HIDDEN, looks_secret, redact
from datasets import archives, transfer
from datasets.errors import StageFailure, UsageError
from datasets.journal import Journal
from datasets.progress import Progress

_REMOTE = re.compile(r"^(?:[\w.+-]+@)?[\w.-]+:(?!//)")  # user@host:path or host:path (not a URL)
_SSH_PASSWORD = re.compile(r"^([\w.+-]+):[^@/]*@([\w.-]+):(?!//)")  # user:password@host:path, written like a URL


@dataclass(frozen=True)
class Source:
    spec: str
    scheme: str  # local | ssh | http
    location: str  # absolute path, host:path or URL
    name: str  # base name for a default destination
    archive: bool


@dataclass(frozen=True)
class Fetch:
    """How to reach remote sources."""

    ssh_command: str
    retries: int
    http_timeout_s: float
    sha256: str = ""
    copy: bool = False  # copy a local folder first (rsync) instead of reading it in place


def parse(spec: str) -> Source:
    """Classify ``spec``; a local path that does not exist is a usage error.

    A URL's ``spec`` is kept redacted (checks/probe/net.py): only ``location`` holds the credentials, and it is
    handed to requests alone, never shown or written.
    """
    if spec.startswith(("http://", "https://")):
        name = file_name(spec)
        return Source(
            spec=redact(spec), scheme="http", location=spec, name=archives.stem(name), archive=archives.is_archive(name)
        )
    password = _SSH_PASSWORD.match(spec)
    if password and not Path(spec).exists():
        user, host = password.group(1), password.group(2)
        raise UsageError(
            f"source {user}:{HIDDEN}@{host}:... carries a password: rsync over SSH cannot use one",
            hint=f"drop the password and let SSH use a key (ssh-copy-id {user}@{host}), then --source {user}@{host}:PATH",
        )
    if _REMOTE.match(spec) and not Path(spec).exists():
        remote_path = spec.split(":", 1)[1]
        name = Path(remote_path.rstrip("/")).name or "remote"
        return Source(spec=spec, scheme="ssh", location=spec, name=name, archive=False)
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(
            f"source {spec} not found", hint="give a folder, a list or text file, an archive, host:/path or a URL"
        )
    path = path.resolve()
    archive = path.is_file() and archives.is_archive(path.name)
    return Source(spec=spec, scheme="local", location=str(path), name=archives.stem(path.name), archive=archive)


def identity(src: Source, how: Fetch, session: requests.Session) -> str:
    """Return what identifies the source's current version without copying it (local folders: see inventory)."""
    if src.scheme == "http":
        return how.sha256.lower() if how.sha256 else transfer.http_identity(session, src.location, how.http_timeout_s)
    if src.scheme == "ssh":
        listing = transfer.list_remote(src.location, how.ssh_command)
        return json.dumps({"listing": listing.digest, "files": listing.files, "bytes": listing.bytes})
    st = os.stat(src.location)
    return json.dumps({"path": src.location, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})


def check_sha256(src: Source, expected: str, progress: Progress) -> None:
    """Check a local file's ``--sha256`` (every run, so a no-op rerun checks it too); a download is checked as it
    lands (transfer.download); a folder or an SSH source has no one file to check: refused."""
    if not expected or src.scheme == "http":
        return
    path = Path(src.location)
    if src.scheme == "ssh" or path.is_dir():
        what = "is copied over SSH" if src.scheme == "ssh" else "is a folder"
        raise UsageError(
            f"--sha256 checks one file (a download or a local archive); {src.spec} {what}",
            hint="drop --sha256, or give the archive or URL it belongs to",
        )
    bar = progress.bar("sha256", path.stat().st_size, "B")
    try:
        digest = transfer.file_sha256(path, bar.update)
    finally:
        bar.close()
    if digest != expected.lower():
        raise StageFailure(
            f"sha256 of {src.spec} is {digest}, expected {expected}", hint="the file changed or is damaged"
        )


def fetch(src: Source, work: Path, journal: Journal, how: Fetch, session: requests.Session, progress: Progress) -> Path:
    """Bring a remote or archived source into ``work``; return the folder to scan. Journaled, so done once."""
    if src.scheme == "local" and not src.archive and (not how.copy or Path(src.location).is_file()):
        return Path(src.location)
    root = work / "fetch"
    if journal.has("fetched"):
        return _top(root) if src.archive else root
    archive = Path(src.location)
    if src.scheme == "ssh" or (src.scheme == "local" and not src.archive):
        remote = src.scheme == "ssh"
        _with_bar(
            progress,
            "copy",
            "B",
            lambda tick: transfer.rsync(
                src.location, root, remote=remote, ssh_command=how.ssh_command, retries=how.retries, progress=tick
            ),
        )
    elif src.scheme == "http":
        archive = work / file_name(src.location)
        _with_bar(
            progress,
            "download",
            "B",
            lambda tick: transfer.download(
                session,
                src.location,
                archive,
                sha256=how.sha256,
                retries=how.retries,
                timeout=how.http_timeout_s,
                progress=tick,
            ),
        )
    if src.archive:
        _unpack(archive, root, journal, progress)
        if src.scheme == "http":
            archive.unlink()
    elif src.scheme == "http":
        root.mkdir(exist_ok=True)
        archive.replace(root / archive.name)
    journal.append({"event": "fetched"})
    return _top(root) if src.archive else root


def file_name(url: str) -> str:
    """The file name a URL downloads to: its last path segment, or "download" when that reads as a secret."""
    name = unquote(Path(urlparse(url).path).name)
    return name if name and not looks_secret(name) else "download"


def _unpack(archive: Path, root: Path, journal: Journal, progress: Progress) -> None:
    scratch = root.with_name("fetch.partial")
    shutil.rmtree(scratch, ignore_errors=True)  # a killed unpacking starts over
    skipped: list[tuple[str, str]] = []
    _with_bar(progress, "unpack", "B", lambda tick: skipped.extend(archives.extract(archive, scratch, tick)))
    shutil.rmtree(root, ignore_errors=True)
    scratch.rename(root)
    journal.append({"event": "unpacked", "skipped": skipped})


def _top(root: Path) -> Path:
    """Step into an archive's single top folder (``data.tar`` holding ``data/``)."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    while len(entries) == 1 and entries[0].is_dir():
        root = entries[0]
        entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    return root


def _with_bar(progress: Progress, what: str, unit: str, work: Callable[[Callable[[int], None]], object]) -> None:
    bar = progress.bar(what, None, unit)
    try:
        work(bar.moveto)
    finally:
        bar.close()


def fingerprint(identity_text: str, params: dict[str, object]) -> str:
    """Hash the source identity with every parameter that changes the output bytes."""
    blob = json.dumps({"source": identity_text, "params": params}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
