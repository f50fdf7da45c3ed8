"""Move bytes: rsync (the only code that runs a program, through ``sh``) and HTTP (an injected requests.Session).

rsync resumes instead of starting over: ``--partial-dir`` keeps a broken file out of its final name, and
``--no-whole-file`` for local-to-local copies, where rsync otherwise implies ``--whole-file`` and throws the
partial file away (docs/sources.md#rsync-resume: 400 MB re-sent of 400 MB, against 191 MB matched). Completion is
journaled by the caller, never read off files existing.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests
import sh

from checks.probe.net import redact, scrub
from checks.units import MIB
from datasets.errors import StageFailure

# Worth retrying (docs/sources.md#rsync-resume): socket I/O, protocol stream, signal, partial transfer, vanished
# source files, timeout, daemon timeout.
RSYNC_RETRY_CODES = frozenset({10, 12, 20, 23, 24, 30, 35})
PARTIAL_DIR = ".rsync-partial"
# ssh could not connect or log in (or the remote has no rsync): rsync exits 255, or 12 when it sees the closed pipe
# first (a race, about 1 run in 5 here), having received nothing; the line above rsync's says why. Retrying does not
# help, it fails again at once. A connection lost after some bytes is not this: that one resumes.
NOTHING_RECEIVED = "connection unexpectedly closed (0 bytes received so far)"
# rsync's summary lines, which say that something failed but not what: "rsync error: unexplained error (code 255)",
# "rsync: connection unexpectedly closed (0 bytes received so far)"; the line above them says what.
_TRAILER = re.compile(r"^rsync(?: error)?: (?:.*\(code \d+\)|connection unexpectedly closed)")
_PROGRESS = re.compile(rb"([\d,]+)\s+(\d+)%")
Progress = Callable[[int], None]  # bytes done so far


@dataclass(frozen=True)
class Listing:
    """What a remote folder holds, from ``rsync --list-only``: its identity for resume and its size."""

    digest: str
    files: int
    bytes: int


def rsync_args(remote: bool, ssh_command: str) -> list[str]:
    """Return rsync's flags: archive mode without devices and FIFOs (the scan skips them), resumable partials,
    overall progress."""
    args = [
        "--archive",
        "--no-devices",
        "--no-specials",
        f"--partial-dir={PARTIAL_DIR}",
        "--info=progress2",
        "--no-human-readable",
    ]
    if remote:
        return [*args, "--timeout=120", "-e", ssh_command]
    return [*args, "--no-whole-file"]


def rsync(src: str, dst: Path, *, remote: bool, ssh_command: str, retries: int, progress: Progress) -> None:
    """Copy the contents of folder ``src`` into ``dst``; retry the retryable failures with a back-off."""
    dst.mkdir(parents=True, exist_ok=True)
    source = src.rstrip("/") + "/"
    for attempt in range(retries + 1):
        try:
            sh.rsync(
                *rsync_args(remote, ssh_command),
                source,
                str(dst) + "/",
                _out=_progress_reader(progress),
                _out_bufsize=0,
                _err_to_out=False,
            )
            return
        except sh.ErrorReturnCode as exc:
            if exc.exit_code not in RSYNC_RETRY_CODES or attempt == retries or _never_connected(exc, remote):
                resume = "run the same command again to resume"
                raise _failure(f"rsync from {src} failed (exit {exc.exit_code})", src, exc, remote, resume) from None
            time.sleep(min(2**attempt, 30))
        except sh.CommandNotFound:
            raise StageFailure("rsync is not installed", hint="apt-get install rsync") from None


def list_remote(src: str, ssh_command: str) -> Listing:
    """List a remote folder without copying it (names, sizes and times go into the digest)."""
    try:
        out = sh.rsync("--recursive", "--list-only", "--no-human-readable", "-e", ssh_command, src.rstrip("/") + "/")
    except sh.ErrorReturnCode as exc:
        raise _failure(f"cannot list {src} (rsync exit {exc.exit_code})", src, exc, True, "") from None
    except sh.CommandNotFound:
        raise StageFailure("rsync is not installed", hint="apt-get install rsync") from None
    lines = sorted(line for line in str(out).splitlines() if line.startswith("-"))
    sizes = [int(line.split()[1].replace(",", "")) for line in lines]
    return Listing(hashlib.sha256("\n".join(lines).encode()).hexdigest(), len(lines), sum(sizes))


def _progress_reader(progress: Progress) -> Callable[[bytes], None]:
    def read(chunk: bytes) -> None:
        found = _PROGRESS.findall(chunk if isinstance(chunk, bytes) else chunk.encode())
        if found:
            progress(int(found[-1][0].replace(b",", b"")))

    return read


def stderr_reason(stderr: bytes | str | None) -> str:
    """Return the line of rsync's (or its ssh's) stderr that says what went wrong: the last one that is not
    rsync's summary (``rsync error: ... (code 23)``), or that summary when it is all there is."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if not _TRAILER.match(line)]
    return (said or lines or ["no message"])[-1]


def _never_connected(exc: sh.ErrorReturnCode, remote: bool) -> bool:
    """Tell whether rsync's remote end never answered: ssh failed, or the remote has no rsync."""
    text = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
    return remote and NOTHING_RECEIVED in text


def _failure(what: str, src: str, exc: sh.ErrorReturnCode, remote: bool, then: str) -> StageFailure:
    """``what`` failed, and the line that says why; when ssh failed, a hint naming the host."""
    reason = stderr_reason(exc.stderr)
    hint = then or None
    if _never_connected(exc, remote):
        hint = _ssh_hint(src.split(":", 1)[0], reason)
    return StageFailure(f"{what}: {reason}", hint=hint)


def _ssh_hint(host: str, reason: str) -> str:
    if "Could not resolve hostname" in reason:
        return f"check the host name {host} in --source or ~/.ssh/config; try: ssh {host} true"
    if "Permission denied" in reason:
        return f"this machine has no key {host} accepts: ssh-copy-id {host}; try: ssh {host} true"
    if "command not found" in reason:
        return f"install rsync on {host}"
    return f"check that ssh reaches {host} from this machine; try: ssh {host} true"


# --- HTTP -----------------------------------------------------------------------------------------------------


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def reason(exc: requests.RequestException) -> str:
    """What went wrong, in a few words: the OS's reason (``Connection refused``, ``Name or service not known``)
    rather than urllib3's retry wrapper around it, which runs to hundreds of characters."""
    text = str(exc)
    found = _ERRNO.search(text)
    if found:
        return found.group(1).strip()
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    return text.splitlines()[0][:200] if text else type(exc).__name__


def http_identity(session: requests.Session, url: str, timeout: float) -> str:
    """Return what identifies the remote file's version: its ETag, Last-Modified and length."""
    try:
        r = session.head(url, allow_redirects=True, timeout=timeout)
    except requests.RequestException as exc:
        raise StageFailure(f"cannot reach {redact(url)}: {scrub(reason(exc), url)}") from None
    if r.status_code >= 400:
        raise StageFailure(f"{redact(url)} answered HTTP {r.status_code}")
    keys = ("ETag", "Last-Modified", "Content-Length")
    return json.dumps({k: r.headers.get(k) for k in keys}, sort_keys=True)


def download(
    session: requests.Session, url: str, dest: Path, *, sha256: str, retries: int, timeout: float, progress: Progress
) -> str:
    """Download ``url`` to ``dest`` resuming with Range; return its sha256 (checked against ``sha256`` if given)."""
    part = dest.with_name(dest.name + ".part")
    for attempt in range(retries + 1):
        try:
            if _fetch(session, url, part, timeout, progress):
                break
        except requests.RequestException as exc:
            if attempt == retries:
                raise StageFailure(
                    f"download of {redact(url)} failed: {scrub(str(exc), url)}", hint="run the same command to resume"
                ) from None
        time.sleep(min(2**attempt, 30) * 0.1)
    else:
        raise StageFailure(
            f"download of {redact(url)} did not complete after {retries + 1} tries",
            hint="run the same command to resume",
        )
    digest = file_sha256(part)
    if sha256 and digest != sha256.lower():
        part.unlink()
        raise StageFailure(
            f"sha256 of {redact(url)} is {digest}, expected {sha256}", hint="the file changed or is damaged"
        )
    part.replace(dest)
    return digest


def _fetch(session: requests.Session, url: str, part: Path, timeout: float, progress: Progress) -> bool:
    """Fetch what is missing of ``part``; True when the file is complete."""
    meta_path = part.with_name(part.name + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() and part.exists() else {}
    have = part.stat().st_size if meta else 0
    headers = {"Range": f"bytes={have}-", "If-Range": meta.get("validator") or ""} if have else {}
    with session.get(url, headers={k: v for k, v in headers.items() if v}, stream=True, timeout=timeout) as r:
        if r.status_code == 416 and have:  # nothing left to send: the part is the whole file
            return True
        if r.status_code not in (200, 206):
            raise StageFailure(f"{redact(url)} answered HTTP {r.status_code}")
        total = _total(r, have)
        if r.status_code == 206 and not r.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise requests.RequestException(f"{redact(url)} sent a range that does not start at byte {have}")
        if r.status_code == 200:  # no range support, or the file changed (If-Range): start over
            have = 0
            validator = r.headers.get("ETag") or r.headers.get("Last-Modified") or ""
            meta_path.write_text(json.dumps({"validator": validator, "total": total}))
        with part.open("r+b" if have else "wb") as fh:
            fh.seek(have)
            fh.truncate()
            for block in r.iter_content(64 << 10):  # small reads: a dropped connection loses < 64 KiB
                fh.write(block)
                have += len(block)
                progress(have)
    return total is None or have == total


def _total(r: requests.Response, have: int) -> int | None:
    if r.status_code == 206:
        found = re.search(r"/(\d+)$", r.headers.get("Content-Range", ""))
        return int(found.group(1)) if found else None
    length = r.headers.get("Content-Length")
    return int(length) if length else None


def file_sha256(path: Path, progress: Callable[[int], object] | None = None) -> str:
    """Hash a file in 1 MiB blocks; ``progress`` hears the size of each block."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(MIB):
            h.update(block)
            if progress is not None:
                progress(len(block))
    return h.hexdigest()
