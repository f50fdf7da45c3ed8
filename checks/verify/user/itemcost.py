"""Where a map-style dataset's batch time goes, as the command itself ran it: per sample in ``__getitem__``
(``__getitems__``) and per batch in the ``collate_fn`` (the agent's ``_MapDatasetFetcher.fetch`` timing).

With ``num_workers=0`` the training process builds each batch inside its data wait: the figures are its own step
fields over the measured steps. With workers each worker times its batches (one ``fetch`` line each, the worker a
child of the training process); the lines timed during the measured steps are used, else all of them (a worker
that ran ahead). Their time is the work per batch, which the workers share: not the wait it causes.

``measurements.item_cost``: ``where`` ("training process" or "workers"), ``workers``, ``batches``, ``samples``
(timed), ``getitem_ms_per_sample``, ``collate_ms_per_batch``, ``samples_per_step``, ``batches_per_step``,
``getitem_ms_per_step``, ``collate_ms_per_step``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Protocol

from checks.verify.events import Event, FetchLine, StepLine


class _Lead(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def steps(self) -> list[StepLine]: ...


def item_cost(lead: _Lead, events: Sequence[Event]) -> dict[str, Any] | None:
    """``measurements.item_cost`` of the pace-setting process (None: no map-style batch was timed)."""
    if not lead.steps:
        return None
    own = [s for s in lead.steps if s.fetched_samples]
    if own:
        samples = sum(s.fetched_samples or 0 for s in own)
        batches = sum(s.fetched_batches or 0 for s in own)
        getitem = sum(s.getitem_s or 0.0 for s in own)
        collate = sum(s.collate_s or 0.0 for s in own)
        where, workers = "training process", 0
    else:
        rows = worker_batches(lead, events)
        lo, hi = lead.steps[0].host_start, lead.steps[-1].host_end
        rows = [e for e in rows if lo <= e.t <= hi] or rows
        if not rows:
            return None
        samples, batches = sum(e.samples for e in rows), len(rows)
        getitem = sum(e.getitem_s for e in rows)
        collate = sum(e.collate_s for e in rows)
        where, workers = "workers", max(e.workers for e in rows)
    if not samples or not batches:
        return None
    per_sample, per_batch = 1e3 * getitem / samples, 1e3 * collate / batches
    n = int(statistics.median(s.samples for s in lead.steps)) or None
    b = int(statistics.median(s.batches for s in lead.steps)) or None
    return {
        "where": where,
        "workers": workers,
        "batches": batches,
        "samples": samples,
        "getitem_ms_per_sample": round(per_sample, 4),
        "collate_ms_per_batch": round(per_batch, 4),
        "samples_per_step": n,
        "batches_per_step": b,
        "getitem_ms_per_step": round(per_sample * n, 3) if n else None,
        "collate_ms_per_step": round(per_batch * b, 3) if b else None,
    }


def worker_batches(lead: _Lead, events: Sequence[Event]) -> list[FetchLine]:
    """The ``fetch`` lines of the batches ``lead``'s DataLoader workers made for the loader its steps read."""
    feed = lead.steps[-1].feed if lead.steps else None
    rows = [e for e in events if isinstance(e, FetchLine) and e.ppid == lead.pid]
    fed = [e for e in rows if e.feed == feed]  # forked workers see the same dataset object
    return fed or rows  # spawned ones unpickled their own copy: a new id
