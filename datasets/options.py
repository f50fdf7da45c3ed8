"""From the task's flags and the typed ``preflight.stage`` configuration to a Request; and the summary line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.config import DiskConfig, StageConfig
from datasets.inventory import Columns
from datasets.places import gib
from datasets.run_images import ImageJob
from datasets.run_text import TextJob
from datasets.sources import Fetch
from datasets.stage import Outcome, Request


@dataclass(frozen=True)
class Flags:
    """The task's flags; empty strings, 0 and -1 mean "from the configuration"."""

    source: str
    dest: str = ""
    kind: str = ""
    format: str = ""
    size: int = 0
    resize: str = ""
    sha256: str = ""
    max_rejects: str = ""
    workers: int = 0
    reserve_cores: int = -1
    copy: bool = False
    field: str = ""
    tokenizer: str = ""
    token_dtype: str = ""


def build_request(cfg: StageConfig, flags: Flags, disk: DiskConfig | None = None) -> Request:
    """Merge ``flags`` over ``cfg``; ``disk`` measures candidate roots when no --dest is given."""
    images = ImageJob(flags.size or cfg.size, flags.resize or cfg.resize, cfg.resample, cfg.shard_size)
    text = TextJob(flags.field or cfg.text_field, flags.tokenizer, flags.token_dtype or cfg.token_dtype)
    fetch = Fetch(cfg.ssh_command, cfg.retries, cfg.http_timeout_s, flags.sha256, flags.copy)
    return Request(
        source=flags.source,
        dest=flags.dest,
        kind=flags.kind or cfg.kind,
        format=flags.format or cfg.format,
        images=images,
        text=text,
        columns=Columns(cfg.path_column, cfg.label_column),
        fetch=fetch,
        dest_roots=cfg.dest_roots,
        disk=disk,
        measured_max_age_h=cfg.measured_max_age_h,
        headroom_fraction=cfg.headroom_fraction,
        max_rejects=flags.max_rejects or cfg.max_rejects,
        workers=flags.workers,
        reserve_cores=flags.reserve_cores if flags.reserve_cores >= 0 else cfg.reserve_cores,
    )


def summary(outcome: Outcome, seconds: float) -> str:
    """Return the one line that ends a run: what, where, how fast."""
    doc: dict[str, Any] = outcome.manifest
    counts = doc.get("counts", {})
    size = gib(sum(e.get("bytes", 0) for e in doc.get("outputs", {}).values()))
    if outcome.noop:
        what = f"{counts.get('staged', 0):,} {'documents' if doc.get('kind') == 'text' else 'images'}"
        return f"already staged: {outcome.dest} ({what}, {size}) matches the source and parameters; nothing to do ({seconds:.1f} s)"
    decode_s = max(doc.get("timings", {}).get("decode_s", 0.0), 1e-9)
    rejected = f", {counts.get('rejected', 0)} rejected" if counts.get("rejected") else ""
    if doc.get("kind") == "text":
        rate = f"{counts.get('tokens', 0) / decode_s:,.0f} tokens/s"
        what = f"{counts.get('tokens', 0):,} tokens from {counts.get('staged', 0):,} documents{rejected}"
    else:
        done = counts.get("inputs", 0) - doc.get("resumed", {}).get("items_done_before", 0)
        rate = f"{done / decode_s:,.0f} images/s"
        what = f"{counts.get('staged', 0):,} images{rejected}"
    return f"staged {what} into {outcome.dest} ({size}) in {seconds:.1f} s: {rate}"
