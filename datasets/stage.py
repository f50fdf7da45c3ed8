"""``invoke stage-data`` end to end: resolve, skip when unchanged, fetch, scan, size, decode, publish.

All work happens in ``.<name>.staging`` next to the destination, under a lock, journaled; the destination
appears by one rename when everything, manifest last, is on disk. A re-run with the same command continues
where a killed one stopped; a re-run on an unchanged source with unchanged parameters does nothing.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import requests

from checks.config import DiskConfig
from checks.errors import PreflightError
from checks.facts import LocationFacts, MountFacts
from checks.probe import disk_cache
from checks.probe.mounts import STAT_TIMEOUT_S, mount_table
from checks.probe.net import scrub, secrets_of
from datasets import decode, manifest, places, resize, run_images, run_text, sources, upscale, workdir
from datasets.errors import StageFailure, UsageError
from datasets.inventory import Inventory, scan, specials_note
from datasets.journal import Journal, locked
from datasets.manifest import Contents, Manifest, SourceInfo
from datasets.progress import Progress, Silent
from datasets.request import FORMATS, KINDS, Outcome, Request, allowed_rejects
from datasets.text import load_tokenizer, tokenizer_id


def stage(
    req: Request,
    session: requests.Session | None = None,
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
) -> Outcome:
    """Stage ``req.source`` and return where it went; raise UsageError (exit 2) or StageFailure (exit 1).

    ``say`` hears, before any work starts, which disk was picked and why (when ``--dest`` was not given).
    Nothing that leaves this function, returned or raised, holds a secret of a URL source.
    """
    with _no_secrets_of(req.source):
        return _stage(req, session, progress, say)


@contextmanager
def _no_secrets_of(source: str) -> Iterator[None]:
    """Scrub the credentials of a URL source out of any error that passes (a library's text may quote it)."""
    if not source.startswith(("http://", "https://")) or not secrets_of(source):
        yield
        return
    try:
        yield
    except PreflightError as exc:
        exc.message, exc.hint = scrub(exc.message or "", source), exc.hint and scrub(exc.hint, source)
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if scrub(text, source) != text:  # an unexpected error that quotes the URL: worded, never its traceback
            raise StageFailure(scrub(text, source)[:500], hint="run the same command to resume") from None
        raise


def _stage(
    req: Request, session: requests.Session | None, progress: Progress | None, say: Callable[[str], None] | None
) -> Outcome:
    _validate(req)
    session = session or requests.Session()
    progress = progress or Silent()
    src = sources.parse(req.source)
    started = time.monotonic()
    if req.kind != "text":  # the decode workers' fork server starts up beside the scan (wasted on a no-op run)
        decode.prestart(decode.worker_count(req.workers, req.reserve_cores))
    try:  # the source is read (or reached) before a disk is picked or anything is written
        sources.check_sha256(src, req.fetch.sha256, progress)
        inv = _scan_local(req, src)
        ident = inv.digest if inv is not None else sources.identity(src, req.fetch, session)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise StageFailure(f"cannot read the source: {exc.strerror or exc}{where}", hint="check --source") from None
    scanned, tell = time.monotonic(), say or (lambda _: None)
    dest = _destination(req, src, inv, tell)
    work = dest.with_name(f".{dest.name}.staging")
    phases = {"scan_s": scanned - started, "place_s": time.monotonic() - scanned}
    for line in _warnings(req, inv) if inv is not None else ():  # a fetched source: after the fetch (_locked_stage)
        tell(line)
    with workdir.made_folders(dest), locked(dest.with_name(f".{dest.name}.lock")):
        try:
            return _locked_stage(req, src, inv, ident, dest, work, session, progress, (started, phases))
        except OSError as exc:
            workdir.drop_if_empty(work)
            raise _disk_error(exc, work) from None
        except BaseException:
            workdir.drop_if_empty(work)
            raise


def verify(folder: Path, progress: Progress | None = None) -> list[str]:
    """Re-hash a staged dataset and check its shapes; a folder without a manifest is a usage error."""
    doc = manifest.read(folder)
    if doc is None:
        raise UsageError(f"{folder} is not a staged dataset (no readable manifest.json)")
    bar = (progress or Silent()).bar("verify", sum(o.bytes for o in doc.contents.outputs.values()), "B")
    try:
        return manifest.verify(folder, bar.update)
    finally:
        bar.close()


def _disk_error(exc: OSError, work: Path) -> StageFailure:
    """Turn an OS error mid-run into one line; the staging folder stays for the re-run to resume."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return StageFailure(
            f"disk full{where}: nothing was published; {work} is kept",
            hint="free some space, then run the same command to resume",
        )
    return StageFailure(f"{exc.strerror or exc}{where}; {work} is kept", hint="run the same command to resume")


def _locked_stage(
    req: Request,
    src: sources.Source,
    inv: Inventory | None,
    ident: str,
    dest: Path,
    work: Path,
    session: requests.Session,
    progress: Progress,
    clock: tuple[float, dict[str, float]],
) -> Outcome:
    """Decide what to do (nothing, resume, start over), then do it; ``clock``: when the run started, the phases so far."""
    started, phases = clock
    params = _params(req, inv)
    fp = sources.fingerprint(ident, params)
    existing = manifest.read(dest)
    if existing is not None and existing.fingerprint == fp and manifest.looks_complete(dest, existing):
        workdir.clean_leftovers(dest, work)
        return Outcome(dest, True, existing)
    _refuse_foreign(dest, existing)
    notes = _why_restage(existing, ident, params)
    if not (Journal(work / "journal.jsonl").fingerprint == fp and (work / "out").is_dir()):
        _check_space(req, inv, work, _fetch_bytes(req, src, inv, ident))  # before anything is written
    journal = _journal(work, fp, notes)
    ready = manifest.read(work / "out") if journal.has("ready") else None
    if ready is not None:  # killed while publishing
        workdir.publish(work / "out", dest, work)
        return Outcome(dest, False, ready, tuple(notes))
    contents, scanned = _produce(req, src, inv, work, journal, session, progress)
    if inv is None:
        notes += _warnings(req, scanned)
    done = time.monotonic()
    times = {k: round(v, 3) for k, v in phases.items()}
    contents = replace(contents, timings=replace(contents.timings, total_s=round(done - started, 3), **times))
    doc = Manifest(
        tool=manifest.TOOL,
        created=manifest.now(),
        fingerprint=fp,
        source=_source_info(src, ident, scanned),
        parameters=params,
        contents=contents,
    )
    manifest.write(work / "out", doc)
    journal.append({"event": "ready"})
    workdir.publish(work / "out", dest, work)
    return Outcome(dest, False, manifest.read(dest) or doc, tuple(notes))


def _produce(
    req: Request,
    src: sources.Source,
    inv: Inventory | None,
    work: Path,
    journal: Journal,
    session: requests.Session,
    progress: Progress,
) -> tuple[Contents, Inventory]:
    """Fetch, scan, check the space, decode or tokenize: return what was staged and the inputs it came from."""
    t = time.monotonic()
    root = sources.fetch(src, work, journal, req.fetch, session, progress)
    fetch_s = time.monotonic() - t
    if inv is None or req.fetch.copy:
        inv = scan(root, req.kind, req.columns)
    if not journal.has("planned"):
        _check_space(req, inv, work, 0)
        journal.append({"event": "planned", "inputs": len(inv.paths)})
    contents = (run_text if inv.kind == "text" else run_images).run(req, inv, work, journal, progress)
    return replace(contents, timings=replace(contents.timings, fetch_s=round(fetch_s, 3))), inv


def _warnings(req: Request, inv: Inventory) -> list[str]:
    """What the user should hear about the inputs: special files skipped, images enlarged by ``--size``."""
    found = [specials_note(inv), upscale.warning(req.images, inv)]  # the latter only of images
    return [line for line in found if line]


def _source_info(src: sources.Source, ident: str, inv: Inventory) -> SourceInfo:
    return SourceInfo(
        spec=src.spec,
        scheme=src.scheme,
        identity=ident,
        layout=inv.layout,
        files=len(inv.paths),
        bytes=inv.total_bytes,
        ignored=inv.ignored,
    )


def _fetch_bytes(req: Request, src: sources.Source, inv: Inventory | None, ident: str) -> int:
    """Bytes the fetch will write: a local copy, a remote listing, a download (what the server says)."""
    if src.scheme == "local" and src.archive:  # at least the archive's size again (a floor: .tar.gz grows)
        return Path(src.location).stat().st_size
    if src.scheme == "local":
        return inv.total_bytes if inv is not None and req.fetch.copy else 0
    try:
        info = json.loads(ident)
    except ValueError:
        return 0  # a sha256 given as identity: no size known
    size = info.get("bytes") or info.get("Content-Length") or 0
    return int(size) * (2 if src.archive else 1)


def _validate(req: Request) -> None:
    if req.kind not in KINDS:
        raise UsageError(f"unknown --kind {req.kind!r}", hint="images, text or auto")
    if req.format not in FORMATS:
        raise UsageError(f"unknown --format {req.format!r}", hint="npy or pt")
    req.images.validate()
    req.text.validate()
    allowed_rejects(req.max_rejects, 1)  # a malformed value fails before any work
    if req.fetch.sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", req.fetch.sha256):
        raise UsageError(f"--sha256 {req.fetch.sha256} is not a sha256", hint="64 hexadecimal digits")
    if req.text.tokenizer:  # a missing file or package fails before anything is written, not mid-run
        load_tokenizer(req.text.tokenizer)
    if req.format == "pt":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError(
                "--format pt needs torch in this environment", hint="use --format npy, or install torch"
            ) from None


def _destination(req: Request, src: sources.Source, inv: Inventory | None, say: Callable[[str], None]) -> Path:
    if req.dest:
        return Path(req.dest).expanduser().absolute()
    suffix = (
        f"-{req.images.size}px" + ("-stretch" if req.images.policy == "stretch" else "") if req.kind != "text" else ""
    )
    name = f"{src.name}{suffix}"
    # A remote source's size is known only once fetched: then check_space has the last word.
    need = int(_estimate(req, inv, None)[0] * (1 + req.headroom_fraction)) if inv is not None else 0
    cached = disk_cache.load(req.measured_max_age_h * 3600)
    measured = list(cached.locations) if cached else []
    when = f"measured by bootstrap {_ago(cached.age_s)} ago" if cached else ""
    table = mount_table()
    roots = places.candidates(list(req.dest_roots), table, _stat_timeout(req))
    choice = places.choose_root(roots, name, need, measured, _measurer(req.disk), when, table)
    if choice is None:
        raise UsageError("no local disk among preflight.stage.dest_roots to stage onto", hint="give --dest DIR")
    say(choice.why)
    return choice.place.path / "staged" / name


def _stat_timeout(req: Request) -> float:
    """How long a statvfs may take before its mount counts as dead: bootstrap's setting (preflight.disk)."""
    return req.disk.stat_timeout_s if req.disk is not None else STAT_TIMEOUT_S


def _measurer(cfg: DiskConfig | None) -> places.Measure | None:
    """Measure a candidate root now, within bootstrap's per-location budget (checks/probe/disk.py)."""
    if cfg is None:
        return None
    from checks.probe.disk import measure_location
    from checks.probe.mounts import read_mounts

    mounts: list[
        MountFacts
    ] = []  # read once, on the first place that needs measuring (statvfs of every mount, with timeouts)

    def measure(place: places.Place) -> LocationFacts:
        if not mounts:
            mounts.extend(read_mounts(cfg.stat_timeout_s))
        return measure_location(str(place.path), True, mounts, cfg)

    return measure


def _estimate(req: Request, inv: Inventory, work: Path | None) -> tuple[int, str, str]:
    """(bytes still needed, what for, a smaller alternative) for decoding ``inv``; ``work``: None before it exists."""
    return (run_text if inv.kind == "text" else run_images).estimate(req, inv, work)


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"


def _scan_local(req: Request, src: sources.Source) -> Inventory | None:
    """Scan a local folder or file in place (its digest is its identity); remote and archives scan after fetch."""
    if src.scheme != "local" or src.archive:
        return None
    return scan(Path(src.location), req.kind, req.columns)


def _params(req: Request, inv: Inventory | None) -> dict[str, Any]:
    """Return every parameter that changes the output bytes: the fingerprint's other half."""
    kind = inv.kind if inv is not None else req.kind
    out: dict[str, Any] = {"kind": kind, "format": req.format}
    if kind != "text":
        job = req.images
        out.update(size=job.size, resize=job.policy, resample=job.resample, columns=asdict(req.columns))
        out["resizer"] = resize.backend_id(job.resample)  # its pixels differ from another's by rounding
        if req.format == "pt":
            out["shard_size"] = job.shard_size
    if kind != "images":
        out.update(
            text_field=req.text.field, tokenizer=tokenizer_id(req.text.tokenizer), token_dtype=req.text.token_dtype
        )
    return out


def _refuse_foreign(dest: Path, existing: Manifest | None) -> None:
    if existing is None and dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(
            f"--dest {dest} exists and is not a staged dataset (no manifest.json); refusing to replace it",
            hint="pick a new or empty folder",
        )


def _why_restage(existing: Manifest | None, ident: str, params: dict[str, Any]) -> list[str]:
    if existing is None:
        return []
    old = existing.parameters
    changed = sorted(k for k in set(old) | set(params) if old.get(k) != params.get(k))
    if changed:
        return [f"restaging: parameters changed ({', '.join(changed)})"]
    if existing.source.identity != ident:
        return ["restaging: the source changed since it was staged"]
    return ["restaging: the staged files are incomplete"]


def _journal(work: Path, fp: str, notes: list[str]) -> Journal:
    journal = Journal(work / "journal.jsonl")
    if journal.fingerprint == fp and (work / "out").is_dir():
        notes.append("resuming an unfinished run")
        return journal
    if work.exists():
        notes.append("discarding an unfinished run for another source or other parameters")
        shutil.rmtree(work)
    (work / "out").mkdir(parents=True)
    journal = Journal(work / "journal.jsonl")
    journal.start(fp)
    return journal


def _check_space(req: Request, inv: Inventory | None, work: Path, fetch_bytes: int) -> None:
    """Compare what the run will still write with the free space (exit 1 with numbers and alternatives)."""
    if inv is None:
        need, what, smaller = fetch_bytes, "the fetched source", ""
    else:
        need, what, smaller = _estimate(req, inv, work)
        need, what = need + fetch_bytes, what + (" plus the copied source" if fetch_bytes else "")
    alternatives = places.candidates(list(req.dest_roots), stat_timeout_s=_stat_timeout(req))
    name = work.name.removeprefix(".").removesuffix(".staging")
    need = int(need * (1 + req.headroom_fraction))
    places.check_space(work, name, need, what, alternatives, smaller, _stat_timeout(req))
