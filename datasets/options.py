"""From the task's flags and the typed ``preflight.stage`` configuration to a Request; and the summary line."""

from __future__ import annotations

from dataclasses import dataclass

from checks.config import DiskConfig, StageConfig
from checks.units import size_binary
from datasets.errors import UsageError
from datasets.inventory import Columns
from datasets.request import ImageJob, Outcome, Request, TextJob
from datasets.sources import Fetch
from datasets.words import count


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
    _check_counts(flags)
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


def _check_counts(flags: Flags) -> None:
    """Refuse a negative process count (exit 2); -1 is the task's own "from the configuration" for --reserve-cores."""
    if flags.workers < 0:
        raise UsageError(
            f"--workers {flags.workers} is negative",
            hint="pass a number of decode processes, or 0 for the usable cores less preflight.stage.reserve_cores",
        )
    if flags.reserve_cores < -1:
        raise UsageError(
            f"--reserve-cores {flags.reserve_cores} is negative",
            hint="pass 0 or more cores to leave free while decoding",
        )


def summary(outcome: Outcome, seconds: float) -> str:
    """Return the one line that ends a run: what, where, how fast (over what this run itself decoded)."""
    contents = outcome.manifest.contents
    counts = contents.counts
    size = size_binary(sum(o.bytes for o in contents.outputs.values()))
    text = contents.kind == "text"
    if outcome.noop:
        what = count(counts.staged, "document" if text else "image")
        return f"already staged: {outcome.dest} ({what}, {size}) matches the source and parameters; nothing to do ({seconds:.1f} s)"
    rejected = f", {counts.rejected:,} rejected" if counts.rejected else ""
    if text:
        what = f"{count(counts.tokens, 'token')} from {count(counts.staged, 'document')}{rejected}"
        rate = _rate(counts.tokens, contents.items_done_before or 0, contents.timings.decode_s, "token", "tokenized")
    else:
        what = f"{count(counts.staged, 'image')}{rejected}"
        rate = _rate(counts.inputs, contents.items_done_before or 0, contents.timings.decode_s, "image", "decoded")
    return f"staged {what} into {outcome.dest} ({size}) in {seconds:.1f} s: {rate}"


def _rate(total: int, before: int, seconds: float, noun: str, verb: str) -> str:
    """Say how fast this run went; after a resume, how much an earlier run did and how much this one did."""
    now = max(0, total - before)
    speed = f"{now / max(seconds, 1e-9):,.0f} {noun}s/s"
    if not before:
        return speed
    if not now:
        return f"resumed: all {count(before, noun)} were {verb} by an earlier run, none left for this one"
    return f"resumed: {count(before, noun)} {verb} by an earlier run, {now:,} now at {speed}"
