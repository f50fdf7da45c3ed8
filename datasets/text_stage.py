"""Run the tokenization of an inventory of text files, resumably: one journal line per batch of input.

Tokens are appended to ``tokens.npy`` (its header rewritten with the final length at the end) and document
lengths to ``doc_lengths.bin``; both are fdatasynced before the journal line that counts them. On resume both
files are cut back to the journaled lengths and reading continues at the journaled byte offset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets import npyfile
from datasets.errors import StageFailure
from datasets.finalize import write_npy
from datasets.inventory import Inventory
from datasets.journal import Journal
from datasets.text import Batch, Tokenizer, read_batches

LENGTHS = "doc_lengths.bin"
Tick = Callable[[int], None]


@dataclass
class Cursor:
    """Where tokenization stands: file index, byte offset in it, tokens and documents written, open document."""

    file: int = 0
    offset: int = 0
    tokens: int = 0
    docs: int = 0
    open_doc: int = 0  # tokens of the document not yet closed
    rejects: int = 0
    file_tokens: int = 0  # tokens and documents before the current file: where a rejected file rolls back to
    file_docs: int = 0


def tokenize(
    inv: Inventory, out: Path, tok: Tokenizer, dtype: np.dtype, field: str, journal: Journal, tick: Tick
) -> Cursor:
    """Tokenize every file of ``inv`` into ``out``; return the final cursor. Rejects go into the journal."""
    cur = _resume(out, dtype, journal)
    limit = np.iinfo(dtype).max
    tokens_fd = os.open(out / "tokens.npy", os.O_WRONLY)
    lengths_fd = os.open(out / LENGTHS, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while cur.file < len(inv.paths):
            _file(Path(inv.path(cur.file)), cur, field, tok, limit, (tokens_fd, lengths_fd), dtype, journal, tick)
    finally:
        os.close(tokens_fd)
        os.close(lengths_fd)
    return cur


def finish(out: Path, dtype: np.dtype, cur: Cursor) -> None:
    """Give tokens.npy its final shape and write doc_offsets.npy (n_docs + 1 starts, the last is the end)."""
    npyfile.rewrite_shape(out / "tokens.npy", dtype, (cur.tokens,))
    lengths = np.fromfile(out / LENGTHS, dtype="<i8", count=cur.docs)
    write_npy(out / "doc_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    (out / LENGTHS).unlink()


def rejects(journal: Journal) -> list[tuple[str, str]]:
    """Return every (where, reason) rejected so far, in order."""
    return [(w, r) for e in journal.all("text") for w, r in e.get("rejects", [])]


def _mark(journal: Journal, cur: Cursor, rejects: list[tuple[str, str]]) -> None:
    journal.append({"event": "text", **vars(cur), "rejects": rejects})


def _file(
    path: Path,
    cur: Cursor,
    field: str,
    tok: Tokenizer,
    limit: int,
    fds: tuple[int, int],
    dtype: np.dtype,
    journal: Journal,
    tick: Tick,
) -> None:
    """Tokenize one file from the cursor on; its last journal line already points at the next file."""
    index, size = cur.file, path.stat().st_size
    try:
        for batch in read_batches(path, cur.offset, field):
            _batch(batch, cur, tok, limit, fds, dtype)
            tick(batch.offset - cur.offset)
            cur.offset = batch.offset
            if batch.offset >= size:
                _next_file(cur)
            _mark(journal, cur, batch.rejects)
    except UnicodeDecodeError as exc:  # a .txt that is not UTF-8: take back what it added, reject it whole
        tick(size - cur.offset)
        cur.tokens, cur.docs, cur.open_doc, cur.rejects = cur.file_tokens, cur.file_docs, 0, cur.rejects + 1
        _next_file(cur)
        _mark(journal, cur, [(path.name, exc.reason)])
    if cur.file == index:  # an empty .jsonl yields no batch
        _next_file(cur)
        _mark(journal, cur, [])


def _next_file(cur: Cursor) -> None:
    cur.file, cur.offset, cur.file_tokens, cur.file_docs = cur.file + 1, 0, cur.tokens, cur.docs


def _batch(batch: Batch, cur: Cursor, tok: Tokenizer, limit: int, fds: tuple[int, int], dtype: np.dtype) -> None:
    cur.rejects += len(batch.rejects)
    ids = tok.encode([p.text for p in batch.pieces])
    lengths = []
    for piece, piece_ids in zip(batch.pieces, ids, strict=True):
        cur.open_doc += len(piece_ids)
        if piece.ends_doc:
            lengths.append(cur.open_doc)
            cur.open_doc = 0
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if flat.size and int(flat.max()) > limit:
        raise StageFailure(
            f"token id {int(flat.max())} does not fit {dtype.name} (tokenizer {tok.name})",
            hint="use --token-dtype uint32",
        )
    _append(fds[0], npyfile.HEADER_BYTES + cur.tokens * dtype.itemsize, flat.astype(dtype).tobytes())
    _append(fds[1], cur.docs * 8, np.asarray(lengths, dtype="<i8").tobytes())
    cur.tokens += int(flat.size)
    cur.docs += len(lengths)


def _append(fd: int, offset: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
    os.fdatasync(fd)


def _resume(out: Path, dtype: np.dtype, journal: Journal) -> Cursor:
    last = journal.last("text")
    if last is None:
        npyfile.create(out / "tokens.npy", dtype, (0,), reserve=False)
        (out / LENGTHS).write_bytes(b"")
        return Cursor()
    cur = Cursor(**{k: int(v) for k, v in last.items() if k not in ("event", "rejects")})
    os.truncate(out / "tokens.npy", npyfile.HEADER_BYTES + cur.tokens * dtype.itemsize)
    os.truncate(out / LENGTHS, cur.docs * 8)
    return cur
