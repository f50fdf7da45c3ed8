"""What one stage-data run is asked to do, and what it did: records only.

Every field that has a configuration key is given by ``options.build_request`` from the typed
``preflight.stage`` view (``templates/defaults.yaml`` is the single source of the defaults); the only defaults
here are what an absent flag means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from checks.config import DiskConfig
from datasets.errors import UsageError
from datasets.images import RESAMPLE, RESIZE_POLICIES
from datasets.inventory import Columns
from datasets.manifest import Manifest
from datasets.sources import Fetch

KINDS = ("auto", "images", "text")
FORMATS = ("npy", "pt")
TOKEN_DTYPES = ("auto", "uint16", "uint32")


@dataclass(frozen=True)
class ImageJob:
    """The parameters that decide the bytes of a staged image dataset."""

    size: int
    policy: str
    resample: str
    shard_size: int

    def validate(self) -> None:
        """Raise UsageError (exit 2) for a value that cannot work."""
        if not 8 <= self.size <= 4096:
            raise UsageError(f"--size {self.size} is out of range", hint="8 to 4096 pixels")
        if self.policy not in RESIZE_POLICIES:
            raise UsageError(f"unknown --resize {self.policy!r}", hint=" or ".join(RESIZE_POLICIES))
        if self.resample not in RESAMPLE:
            raise UsageError(f"unknown resample filter {self.resample!r}", hint=", ".join(RESAMPLE))
        if self.shard_size < 1:
            raise UsageError("preflight.stage.shard_size must be at least 1")

    @property
    def row_shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, 3)


@dataclass(frozen=True)
class TextJob:
    """The parameters that decide the bytes of a staged token stream."""

    field: str
    token_dtype: str
    tokenizer: str = ""  # --tokenizer, a tokenizer.json path (no configuration key); empty: byte-level

    def validate(self) -> None:
        """Raise UsageError (exit 2) for a value that cannot work."""
        if self.token_dtype not in TOKEN_DTYPES:
            raise UsageError(f"unknown --token-dtype {self.token_dtype!r}", hint=", ".join(TOKEN_DTYPES))


@dataclass(frozen=True)
class Request:
    """One stage-data run, fully resolved from flags and configuration."""

    source: str
    dest: str  # empty: a root among dest_roots (places.choose_root)
    kind: str
    format: str
    images: ImageJob
    text: TextJob
    max_rejects: str
    workers: int  # 0: the usable cores less reserve_cores
    reserve_cores: int
    columns: Columns
    fetch: Fetch
    dest_roots: tuple[str, ...]
    headroom_fraction: float
    disk: DiskConfig | None  # how to measure a candidate root now; None: rank by free space only
    measured_max_age_h: float  # bootstrap's disk measurements older than this are measured again


@dataclass(frozen=True)
class Outcome:
    """What a run did, for the summary line."""

    dest: Path
    noop: bool
    manifest: Manifest
    notes: tuple[str, ...] = ()


def allowed_rejects(spec: str, inputs: int) -> int:
    """Turn ``--max-rejects`` ("25", "0.1%", "0.001") into a count for ``inputs`` items."""
    text = spec.strip()
    try:
        if text.endswith("%"):
            return math.floor(float(text[:-1]) / 100 * inputs)
        if "." in text or "e" in text.lower():
            return math.floor(float(text) * inputs)
        return int(text)
    except ValueError:
        raise UsageError(
            f"--max-rejects {spec!r} is neither a count nor a fraction", hint='e.g. 25, "0.1%" or 0.001'
        ) from None
