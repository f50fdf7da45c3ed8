"""The text part of a staging run: size estimate, resumable tokenization, rejects, final arrays."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets import text_stage
from datasets.errors import StageFailure, UsageError
from datasets.inventory import Inventory
from datasets.journal import Journal
from datasets.progress import Progress
from datasets.run_images import allowed_rejects, describe
from datasets.text import load_tokenizer, token_dtype

if TYPE_CHECKING:
    from datasets.stage import Request

TOKEN_DTYPES = ("auto", "uint16", "uint32")


@dataclass(frozen=True)
class TextJob:
    """The parameters that decide the bytes of a staged token stream."""

    field: str = "text"
    tokenizer: str = ""  # a tokenizer.json path; empty: byte-level
    token_dtype: str = "auto"

    def validate(self) -> None:
        """Raise UsageError (exit 2) for a value that cannot work."""
        if self.token_dtype not in TOKEN_DTYPES:
            raise UsageError(f"unknown --token-dtype {self.token_dtype!r}", hint=", ".join(TOKEN_DTYPES))

    def tokenizer_id(self) -> str:
        """Name the tokenizer by content, so an edited tokenizer.json restages."""
        if not self.tokenizer:
            return "byte-level"
        try:
            return "sha256:" + hashlib.sha256(Path(self.tokenizer).read_bytes()).hexdigest()
        except OSError:
            return self.tokenizer  # load_tokenizer reports the missing file


def estimate(req: Request, inv: Inventory, work: Path | None) -> tuple[int, str, str]:
    """Return (bytes still needed, what for, alternative): at most one token per input byte."""
    itemsize = 4 if req.text.token_dtype == "uint32" else 2
    return inv.total_bytes * itemsize + (1 << 20), f"{inv.total_bytes:,} bytes of text as tokens", ""


def run(req: Request, inv: Inventory, work: Path, journal: Journal, progress: Progress) -> dict[str, Any]:
    """Tokenize ``inv`` into ``work/out``; return the manifest's body."""
    tok = load_tokenizer(req.text.tokenizer)
    dtype = token_dtype(tok.vocab_size, req.text.token_dtype)
    out = work / "out"
    t = time.monotonic()
    bar = progress.bar("tokenize", inv.total_bytes, "B")
    try:
        cur = text_stage.tokenize(inv, out, tok, dtype, req.text.field, journal, bar.update)
    finally:
        bar.close()
    rejects = text_stage.rejects(journal)
    allowed = allowed_rejects(req.max_rejects, cur.docs + len(rejects))
    if len(rejects) > allowed:
        raise StageFailure(
            f"{len(rejects)} documents rejected, more than --max-rejects allows ({allowed}): "
            + "; ".join(f"{w}: {r}" for w, r in rejects[:3]),
            hint="fix the input or raise --max-rejects",
        )
    if cur.docs == 0:
        raise StageFailure(f"no documents found in {inv.root}", hint=f"is the JSON field {req.text.field!r}?")
    tokenize_s = time.monotonic() - t
    t = time.monotonic()
    text_stage.finish(out, dtype, cur)
    outputs = describe(out, progress)
    return {
        "kind": "text",
        "format": "npy",
        "tokenizer": {"name": tok.name, "vocab_size": tok.vocab_size, "dtype": dtype.name},
        "counts": {"inputs": len(inv.paths), "staged": cur.docs, "rejected": len(rejects), "tokens": cur.tokens},
        "outputs": outputs,
        "rejects": [{"path": w, "reason": r} for w, r in rejects],
        "timings": {"decode_s": round(tokenize_s, 3), "finalize_s": round(time.monotonic() - t, 3)},
    }
