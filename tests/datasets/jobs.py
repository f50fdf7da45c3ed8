"""Stage-data requests for tests, built as the task builds them: flags over the configured defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from checks.config import make_config
from datasets.journal import Journal
from datasets.options import Flags, build_request
from datasets.request import Request

STAGE = make_config().stage  # templates/defaults.yaml: the only place the defaults live


def request(
    source: str | Path,
    dest: str | Path,
    *,
    images: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
    **fields: Any,
) -> Request:
    """Return the request for ``source`` into ``dest`` with some fields (and image or text job fields) changed."""
    base = build_request(STAGE, Flags(source=str(source), dest=str(dest)))
    return dataclasses.replace(
        base,
        images=dataclasses.replace(base.images, **(images or {})),
        text=dataclasses.replace(base.text, **(text or {})),
        **fields,
    )


def crash_on(monkeypatch: pytest.MonkeyPatch, event: str, nth: int) -> None:
    """Make the ``nth`` journal append of ``event`` raise KeyboardInterrupt, as a Ctrl-C at that point would."""
    real, seen = Journal.append, {"n": 0}

    def append(self: Journal, e: dict) -> None:
        if e["event"] == event:
            seen["n"] += 1
            if seen["n"] == nth:
                raise KeyboardInterrupt
        real(self, e)

    monkeypatch.setattr(Journal, "append", append)
