"""From the task's flags and the typed ``preflight.stage`` configuration to a Request; and the summary line."""

from __future__ import annotations

from dataclasses import dataclass

from checks.config import DiskConfig, StageConfig
from datasets.inventory import Columns
from datasets.places import gib
from datasets.request import ImageJob, Outcome, Request, TextJob
from datasets.sources import Fetch


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
    images = ImageJob(
        size=flags.size or cfg.size,
        policy=flags.resize or cfg.resize,
        resample=cfg.resample,
        shard_size=cfg.shard_size,
    )
    text = TextJob(
        field=flags.field or cfg.text_field,
        token_dtype=flags.token_dtype or cfg.token_dtype,
        tokenizer=flags.tokenizer,
    )
    fetch = Fetch(
        ssh_command=cfg.ssh_command,
        retries=cfg.retries,
        http_timeout_s=cfg.http_timeout_s,
        sha256=flags.sha256,
        copy=flags.copy,
    )
    return Request(
        source=flags.source,
        dest=flags.dest,
        kind=flags.kind or cfg.kind,
        format=flags.format or cfg.format,
        images=images,
        text=text,
        columns=Columns(path=cfg.path_column, label=cfg.label_column),
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
    contents = outcome.manifest.contents
    counts = contents.counts
    size = gib(sum(o.bytes for o in contents.outputs.values()))
    if outcome.noop:
        what = f"{counts.staged:,} {'documents' if contents.kind == 'text' else 'images'}"
        return f"already staged: {outcome.dest} ({what}, {size}) matches the source and parameters; nothing to do ({seconds:.1f} s)"
    decode_s = max(contents.timings.decode_s, 1e-9)
    rejected = f", {counts.rejected} rejected" if counts.rejected else ""
    if contents.kind == "text":
        rate = f"{counts.tokens / decode_s:,.0f} tokens/s"
        what = f"{counts.tokens:,} tokens from {counts.staged:,} documents{rejected}"
    else:
        done = counts.inputs - (contents.items_done_before or 0)
        rate = f"{done / decode_s:,.0f} images/s"
        what = f"{counts.staged:,} images{rejected}"
    return f"staged {what} into {outcome.dest} ({size}) in {seconds:.1f} s: {rate}"
