"""Tokenize .txt / .jsonl into ``tokens.npy`` (one flat stream) and ``doc_offsets.npy`` (where each document starts).

A .txt file is one document; each .jsonl line is one, its text under a configurable field. Byte-level by default
(the UTF-8 bytes are the tokens: nothing to download, nothing to trust); a Hugging Face ``tokenizer.json`` through
the ``tokenizers`` package when given. uint16 when the vocabulary fits, else uint32; a token id that does not fit
the chosen type stops the run, never wraps (nanoGPT's uint16 only has a comment: docs/sources.md#token-dtype).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from datasets import npyfile
from datasets.errors import UsageError

BATCH_BYTES = 16 << 20  # input read, tokenized and journaled per step
UINT16_VOCAB = 1 << 16


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, texts: list[str]) -> list[np.ndarray]: ...


class ByteLevel:
    """The UTF-8 bytes of the text are the token ids (vocabulary 256)."""

    name = "byte-level"
    vocab_size = 256

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]


class HfTokenizer:
    """A Hugging Face ``tokenizer.json`` read from disk (no hub access), special tokens not added."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as Hf
        except ImportError:
            raise UsageError("--tokenizer needs the tokenizers package", hint="pip install tokenizers") from None
        try:
            self._tok = Hf.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception for bad files
            raise UsageError(f"cannot load tokenizer {path}: {exc}") from None
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        self.name = f"{path.name} (sha256 {digest})"
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(texts, add_special_tokens=False)]


def load_tokenizer(path: str) -> Tokenizer:
    """Return the tokenizer in ``path`` (a tokenizer.json), or byte-level when ``path`` is empty."""
    if not path:
        return ByteLevel()
    if not Path(path).is_file():
        raise UsageError(f"tokenizer file {path} not found", hint="give the path of a tokenizer.json")
    return HfTokenizer(Path(path))


def tokenizer_id(path: str) -> str:
    """Name the tokenizer in ``path`` by content, so an edited tokenizer.json restages ("byte-level" for none)."""
    if not path:
        return ByteLevel.name
    try:
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return path  # load_tokenizer reports the missing file


def token_dtype(vocab_size: int, requested: str) -> np.dtype:
    """Return uint16 or uint32 for ``vocab_size``; a requested type too small for it is an error."""
    fits16 = vocab_size <= UINT16_VOCAB
    if requested == "uint16" and not fits16:
        raise UsageError(f"a vocabulary of {vocab_size:,} tokens does not fit uint16", hint="use --token-dtype uint32")
    if vocab_size > 1 << 32:
        raise UsageError(f"a vocabulary of {vocab_size:,} tokens does not fit uint32")
    if requested == "uint32" or not fits16:
        return np.dtype("<u4")
    return np.dtype("<u2")


@dataclass(frozen=True)
class Piece:
    """Text to tokenize; ``ends_doc`` closes the current document after it."""

    text: str
    ends_doc: bool


@dataclass(frozen=True)
class Batch:
    pieces: list[Piece]
    offset: int  # input byte offset after this batch
    rejects: list[tuple[str, str]]


def read_batches(path: Path, start: int, field: str) -> Iterator[Batch]:
    """Yield batches of a file from byte ``start``; raise UnicodeDecodeError (with the offset) for a bad .txt."""
    jsonl = path.suffix.lower() == ".jsonl"
    with path.open("rb") as fh:
        fh.seek(start)
        offset = start
        size = os.fstat(fh.fileno()).st_size
        while offset < size or (size == 0 and not jsonl):  # an empty .txt is one empty document
            raw = _read_batch(fh, jsonl)
            end = offset + len(raw)
            if jsonl:
                pieces, rejects = _jsonl_pieces(raw, path, field, offset)
                yield Batch(pieces, end, rejects)
            else:
                yield Batch([Piece(_utf8(raw, offset), ends_doc=end >= size)], end, [])
            offset = end
            if not raw:
                break


def _read_batch(fh: BinaryIO, whole_lines: bool) -> bytes:
    """Read about BATCH_BYTES ending after a newline; a longer line is read whole (jsonl) or cut between characters."""
    raw = fh.read(BATCH_BYTES)
    if len(raw) < BATCH_BYTES:
        return raw
    cut = raw.rfind(b"\n") + 1
    if not cut and whole_lines:
        return raw + fh.readline()
    cut = cut or _char_boundary(raw)
    fh.seek(cut - len(raw), os.SEEK_CUR)
    return raw[:cut]


def _char_boundary(raw: bytes) -> int:
    """Return the start of the last (possibly incomplete) UTF-8 character in ``raw``."""
    cut = len(raw)
    while cut > 1 and raw[cut - 1] & 0xC0 == 0x80:  # continuation bytes
        cut -= 1
    return cut - 1 if raw[cut - 1] >= 0xC0 else len(raw)


def _utf8(raw: bytes, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError("utf-8", raw, exc.start, exc.end, f"not UTF-8 at byte {offset + exc.start}") from None


def _jsonl_pieces(raw: bytes, path: Path, field: str, offset: int) -> tuple[list[Piece], list[tuple[str, str]]]:
    pieces, rejects = [], []
    for line in raw.split(b"\n"):
        where, offset = f"{path.name} at byte {offset}", offset + len(line) + 1
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            rejects.append((where, "not a JSON line"))
            continue
        value = doc.get(field) if isinstance(doc, dict) else None
        if not isinstance(value, str):
            rejects.append((where, f"no string field {field!r}"))
            continue
        pieces.append(Piece(value, ends_doc=True))
    return pieces, rejects


def create_stream(path: Path, dtype: np.dtype) -> None:
    """Start an empty token stream file: the header now, the shape rewritten when complete."""
    npyfile.create(path, dtype, (0,), reserve=False)
