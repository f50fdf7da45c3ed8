"""manifest.json: what a staged dataset is, written last; and ``--verify``, which re-checks a dataset against it.

``Manifest`` is the typed record; ``to_json`` and ``from_json`` are its only way to and from disk. Schema 1 (add
fields freely; bump ``schema`` only for breaking changes)::

    {"schema": 1, "tool": "gpu-preflight 0.1.0", "created": "2026-11-29T16:00:00Z",
     "kind": "images" | "text", "format": "npy" | "pt", "fingerprint": "<sha256 of source identity + parameters>",
     "source": {"spec": "...", "scheme": "local" | "ssh" | "http", "identity": "...",
                "layout": "imagefolder" | "list" | "text", "files": 1000, "bytes": 123456, "ignored": {".txt": 2}},
     "parameters": {"kind": "images", "format": "npy", "size": 256, "resize": "crop", ...},
     "counts": {"inputs": 1000, "staged": 998, "rejected": 2, "tokens": 0},
     "classes": {"count": 10, "per_class": {"cat": 100, ...}},                  (images only)
     "tokenizer": {"name": "byte-level", "vocab_size": 256, "dtype": "uint16"},  (text only)
     "outputs": {"images.npy": {"bytes": 1, "sha256": "...", "shape": [998, 256, 256, 3], "dtype": "uint8"}, ...},
     "rejects": [{"path": "cat/x.jpg", "reason": "corrupt or truncated: ..."}],
     "timings": {"fetch_s": 0.0, "decode_s": 10.0, "finalize_s": 0.5, "total_s": 10.9, "scan_s": 0.1,
                 "place_s": 0.0, "workers_s": 0.05},
     "resumed": {"items_done_before": 0}}    (images: inputs decoded earlier; text: tokens tokenized earlier)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from checks import TOOL_NAME, TOOL_VERSION
from datasets.finalize import fsync_dir, write_text
from datasets.transfer import file_sha256

SCHEMA = 1
NAME = "manifest.json"
TOOL = f"{TOOL_NAME} {TOOL_VERSION}"


@dataclass(frozen=True)
class SourceInfo:
    """Where the inputs came from, what identifies their version, and what the scan found."""

    spec: str
    scheme: str  # local | ssh | http
    identity: str
    layout: str  # imagefolder | list | text
    files: int
    bytes: int
    ignored: dict[str, int]  # suffix -> files skipped


@dataclass(frozen=True)
class Counts:
    inputs: int
    staged: int
    rejected: int
    tokens: int


@dataclass(frozen=True)
class Output:
    """One published file; arrays also record their shape and dtype."""

    bytes: int
    sha256: str
    shape: tuple[int, ...] | None
    dtype: str | None


@dataclass(frozen=True)
class Reject:
    path: str
    reason: str


@dataclass(frozen=True)
class Classes:
    count: int
    per_class: dict[str, int]


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    vocab_size: int
    dtype: str


@dataclass(frozen=True)
class Timings:
    """Seconds per phase of the run; ``total_s`` is from the call into stage-data until the manifest is written.

    Not in it: the process's own start-up (interpreter, Invoke, imports) before that call, which only a caller
    outside the process sees (BENCHMARKS.md, "stage-data against LitData", times the whole command).
    """

    fetch_s: float
    decode_s: float  # tokenizing, for text
    finalize_s: float
    total_s: float
    # Phases recorded since commit 346b8d1 (None, and left out of the file, in a manifest written before):
    scan_s: float | None = None  # listing a local source (sizes and dates: its identity)
    place_s: float | None = None  # choosing the destination disk (and measuring it, without --dest)
    workers_s: float | None = None  # starting the decode processes, less what overlapped earlier steps (in decode_s)


@dataclass(frozen=True)
class Contents:
    """What a decode or tokenize run produced (the manifest less the source, parameters and header)."""

    kind: str  # images | text
    format: str
    counts: Counts
    outputs: dict[str, Output]
    rejects: tuple[Reject, ...]
    timings: Timings  # a run fills decode_s and finalize_s; stage adds fetch_s and total_s
    classes: Classes | None  # images only
    tokenizer: TokenizerInfo | None  # text only
    items_done_before: int | None  # done by an earlier, interrupted run: images decoded, or tokens (text)


@dataclass(frozen=True)
class Manifest:
    """A staged dataset's manifest.json."""

    tool: str
    created: str  # UTC, ISO 8601
    fingerprint: str  # sha256 of the source identity and the parameters
    source: SourceInfo
    parameters: dict[str, Any]  # every parameter that changes the output bytes (the fingerprint's other half)
    contents: Contents

    def to_json(self) -> dict[str, Any]:
        """Return the manifest.json document, keys in the order a reader looks for them."""
        c = self.contents
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "tool": self.tool,
            "created": self.created,
            "kind": c.kind,
            "format": c.format,
            "fingerprint": self.fingerprint,
            "source": _fields(self.source),
            "parameters": self.parameters,
            "counts": _fields(c.counts),
        }
        if c.classes is not None:
            doc["classes"] = _fields(c.classes)
        if c.tokenizer is not None:
            doc["tokenizer"] = _fields(c.tokenizer)
        doc["outputs"] = {name: _output_json(o) for name, o in c.outputs.items()}
        doc["rejects"] = [_fields(r) for r in c.rejects]
        doc["timings"] = {k: v for k, v in _fields(c.timings).items() if v is not None}
        if c.items_done_before is not None:
            doc["resumed"] = {"items_done_before": c.items_done_before}
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Manifest:
        """Read a schema-1 document; raise KeyError, TypeError or ValueError for one that is not."""
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}, not {SCHEMA}")
        src, times = doc["source"], doc.get("timings", {})
        contents = Contents(
            kind=str(doc["kind"]),
            format=str(doc["format"]),
            counts=Counts(**{k: int(doc["counts"].get(k, 0)) for k in ("inputs", "staged", "rejected", "tokens")}),
            outputs={str(name): _output(entry) for name, entry in doc["outputs"].items()},
            rejects=tuple(Reject(path=str(r["path"]), reason=str(r["reason"])) for r in doc.get("rejects", [])),
            timings=_timings(times),
            classes=_classes(doc["classes"]) if "classes" in doc else None,
            tokenizer=_tokenizer(doc["tokenizer"]) if "tokenizer" in doc else None,
            items_done_before=int(doc["resumed"]["items_done_before"]) if "resumed" in doc else None,
        )
        return cls(
            tool=str(doc.get("tool", "")),
            created=str(doc.get("created", "")),
            fingerprint=str(doc["fingerprint"]),
            source=SourceInfo(
                spec=str(src["spec"]),
                scheme=str(src["scheme"]),
                identity=str(src["identity"]),
                layout=str(src.get("layout", "")),
                files=int(src.get("files", 0)),
                bytes=int(src.get("bytes", 0)),
                ignored={str(k): int(v) for k, v in src.get("ignored", {}).items()},
            ),
            parameters=dict(doc["parameters"]),
            contents=contents,
        )


def _fields(record: Any) -> dict[str, Any]:
    """A flat record's fields in declaration order."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _timings(times: dict[str, Any]) -> Timings:
    """Read the timings; the four of schema 1's first version default to 0, the later phases to None."""
    first = {k: float(times.get(k, 0.0)) for k in ("fetch_s", "decode_s", "finalize_s", "total_s")}
    later = {f.name: float(times[f.name]) for f in fields(Timings) if f.name not in first and f.name in times}
    return Timings(**first, **later)


def _output_json(o: Output) -> dict[str, Any]:
    entry: dict[str, Any] = {"bytes": o.bytes, "sha256": o.sha256}
    if o.shape is not None:
        entry.update(shape=list(o.shape), dtype=o.dtype)
    return entry


def _output(entry: dict[str, Any]) -> Output:
    shape = entry.get("shape")
    dtype = entry.get("dtype")
    return Output(
        bytes=int(entry["bytes"]),
        sha256=str(entry["sha256"]),
        shape=tuple(int(n) for n in shape) if shape is not None else None,
        dtype=str(dtype) if dtype is not None else None,
    )


def _classes(entry: dict[str, Any]) -> Classes:
    return Classes(count=int(entry["count"]), per_class={str(k): int(v) for k, v in entry["per_class"].items()})


def _tokenizer(entry: dict[str, Any]) -> TokenizerInfo:
    return TokenizerInfo(name=str(entry["name"]), vocab_size=int(entry["vocab_size"]), dtype=str(entry["dtype"]))


def now() -> str:
    """Return the current UTC time as the manifest's ``created`` stamp."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def describe_outputs(
    out: Path, tick: Callable[[int], None], known: Mapping[str, str] | None = None
) -> dict[str, Output]:
    """Hash every output file in ``out`` and record its size (and, for arrays, shape and dtype).

    ``known`` holds sha256s already taken while the files were written (stage-data's writers hash as they go);
    those files are not read again, and ``tick`` is called for the bytes actually hashed here.
    """
    known = known or {}
    found: dict[str, Output] = {}
    for path in sorted(out.iterdir()):
        if path.name == NAME or path.name.startswith(".") or not path.is_file():
            continue
        shape, dtype = None, None
        if path.suffix == ".npy":
            array = np.load(path, mmap_mode="r")
            shape, dtype = tuple(array.shape), str(array.dtype)
        size = path.stat().st_size
        sha = known.get(path.name)
        if sha is None:
            sha = file_sha256(path)
            tick(size)
        found[path.name] = Output(bytes=size, sha256=sha, shape=shape, dtype=dtype)
    return found


def write(out: Path, manifest: Manifest) -> None:
    """Write manifest.json into ``out`` last, and make it durable."""
    write_text(out / NAME, json.dumps(manifest.to_json(), indent=2) + "\n")
    fsync_dir(out)


def read(folder: Path) -> Manifest | None:
    """Return a staged dataset's manifest, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((folder / NAME).read_text(encoding="utf-8"))
        return Manifest.from_json(doc) if isinstance(doc, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def looks_complete(folder: Path, manifest: Manifest) -> bool:
    """Cheap check for the no-op path: every output file is there with its recorded size."""
    for name, entry in manifest.contents.outputs.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != entry.bytes:
            return False
    return True


def verify(folder: Path, tick: Callable[[int], None]) -> list[str]:
    """Re-hash every output and check array shapes against the manifest; return the problems found."""
    manifest = read(folder)
    if manifest is None:
        return [f"{folder / NAME} is missing or not a gpu-preflight manifest (schema {SCHEMA})"]
    problems = []
    for name, entry in sorted(manifest.contents.outputs.items()):
        problems += _check_file(folder / name, entry, tick)
    problems += _check_counts(folder, manifest.contents)
    return problems


def _check_file(path: Path, entry: Output, tick: Callable[[int], None]) -> list[str]:
    if not path.is_file():
        return [f"{path.name}: missing"]
    size = path.stat().st_size
    if size != entry.bytes:
        return [f"{path.name}: {size} bytes, manifest says {entry.bytes}"]
    problems = []
    if file_sha256(path) != entry.sha256:
        problems.append(f"{path.name}: sha256 differs from the manifest (the file changed or is damaged)")
    tick(size)
    if path.suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r")
        except ValueError as exc:
            return [*problems, f"{path.name}: not a readable .npy ({exc})"]
        if tuple(array.shape) != entry.shape or str(array.dtype) != entry.dtype:
            problems.append(
                f"{path.name}: shape {list(array.shape)} {array.dtype}, manifest says "
                f"{_shape_text(entry.shape)} {entry.dtype}"
            )
    return problems


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return str(list(shape)) if shape is not None else "None"


def _check_counts(folder: Path, contents: Contents) -> list[str]:
    """Cross-check the arrays with each other: one label per image, offsets ending at the token count."""
    outputs, staged = contents.outputs, contents.counts.staged
    problems = []
    for name in ("images.npy", "labels.npy"):
        if name in outputs:
            rows = (outputs[name].shape or (None,))[0]
            if rows != staged:
                problems.append(f"{name}: {rows} rows, manifest counts {staged} staged")
    if "doc_offsets.npy" in outputs and (folder / "doc_offsets.npy").is_file():
        offsets = np.load(folder / "doc_offsets.npy")
        tokens = contents.counts.tokens
        if len(offsets) and (int(offsets[-1]) != tokens or bool(np.any(np.diff(offsets) < 0))):
            problems.append("doc_offsets.npy: offsets are not increasing up to the token count")
    return problems
