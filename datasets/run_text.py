"""The text part of a staging run: size estimate, resumable tokenization, rejects, final arrays."""

from __future__ import annotations

import time
from pathlib import Path

from checks.units import MIB
from datasets import text_stage
from datasets.errors import StageFailure
from datasets.inventory import Inventory
from datasets.journal import Journal
from datasets.manifest import Contents, Counts, Reject, Timings, TokenizerInfo
from datasets.progress import Progress
from datasets.request import Request, allowed_rejects
from datasets.run_images import describe
from datasets.text import load_tokenizer, token_dtype
from datasets.words import count


def estimate(req: Request, inv: Inventory, work: Path | None) -> tuple[int, str, str]:
    """Return (bytes still needed, what for, alternative): at most one token per input byte."""
    itemsize = 4 if req.text.token_dtype == "uint32" else 2
    return inv.total_bytes * itemsize + MIB, f"{inv.total_bytes:,} bytes of text as tokens", ""


def run(req: Request, inv: Inventory, work: Path, journal: Journal, progress: Progress) -> Contents:
    """Tokenize ``inv`` into ``work/out``; return what was staged (no fetch time yet)."""
    tok = load_tokenizer(req.text.tokenizer)
    dtype = token_dtype(tok.vocab_size, req.text.token_dtype)
    out = work / "out"
    earlier = journal.last("text")
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
            f"{count(len(rejects), 'document')} rejected, more than --max-rejects allows ({allowed:,}): "
            + "; ".join(f"{w}: {r}" for w, r in rejects[:3]),
            hint="fix the input or raise --max-rejects",
        )
    if cur.docs == 0:
        raise StageFailure(f"no documents found in {inv.root}", hint=f"is the JSON field {req.text.field!r}?")
    tokenize_s = time.monotonic() - t
    t = time.monotonic()
    text_stage.finish(out, dtype, cur)
    outputs = describe(out, progress)
    return Contents(
        kind="text",
        format="npy",
        counts=Counts(inputs=len(inv.paths), staged=cur.docs, rejected=len(rejects), tokens=cur.tokens),
        outputs=outputs,
        rejects=tuple(Reject(path=w, reason=r) for w, r in rejects),
        timings=Timings(
            fetch_s=0.0, decode_s=round(tokenize_s, 3), finalize_s=round(time.monotonic() - t, 3), total_s=0.0
        ),
        classes=None,
        tokenizer=TokenizerInfo(name=tok.name, vocab_size=tok.vocab_size, dtype=dtype.name),
        items_done_before=int(earlier["tokens"]) if earlier else 0,
    )
