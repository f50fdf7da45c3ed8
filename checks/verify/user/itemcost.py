"""Where a map-style dataset's batch time goes, as the command itself ran it: per sample in ``__getitem__``
(``__getitems__``) and per batch in the ``collate_fn`` (the agent's ``_MapDatasetFetcher.fetch`` timing).

With ``num_workers=0`` the training process builds each batch inside its data wait: the figures are its own step
fields over the measured steps. With workers each worker times its batches (one ``fetch`` line each, the worker a
child of the training process); the lines timed during the measured steps are used, else all of them (a worker
that ran ahead). Their time is the work per batch, which the workers share: not the wait it causes.

``measurements.item_cost``: ``where`` ("training process" or "workers"), ``workers``, ``batches``, ``samples``
(timed), ``getitem_ms_per_sample``, ``collate_ms_per_batch``, ``samples_per_step``, ``batches_per_step``,
``getitem_ms_per_step``, ``collate_ms_per_step``, and ``split`` (None: no transform pipeline found or timed).

``split``: a sample's ``__getitem__`` time by the steps of its dataset's transform pipeline, from the agent's
``transforms`` lines (a sample of the measured run's batches, in whichever process built them): ``method``
("compose": a ``Compose``-like ``.transforms`` list; "transform": one callable), ``pipeline`` (where it was found),
``batches``, ``samples``, ``ms_per_sample`` and ``parts`` (``name``, ``ms`` a sample, ``share`` of the sample's
time; largest first), the rest of ``__getitem__`` as ``REST`` (the read and the decode). A data verdict's fix
then names the costliest part, and what pre-decoding with ``invoke stage-data`` would remove: an estimate from
the shares, never measured.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from checks.verify.diagnosis import Verdict
from checks.verify.events import Event, FetchLine, StepLine, TransformsLine

REST = "read + decode"  # what __getitem__ spends outside its timed transforms
# Transforms of fixed geometry that stage-data does once ahead: it stores decoded images resized to S x S (shorter
# side to S, centre crop: docs/stage-data.md), so these and the read + decode leave the per-sample work, where they
# come first in the pipeline (a resize after a random crop sees a different crop each time: it stays).
STAGED = ("Resize", "CenterCrop")
# From this share of a sample's time, pre-decoding is advised before the costliest transform (tool-defined).
STAGE_MIN_SHARE = 0.2


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
        "split": transform_split(lead, events),
    }


def worker_batches(lead: _Lead, events: Sequence[Event]) -> list[FetchLine]:
    """The ``fetch`` lines of the batches ``lead``'s DataLoader workers made for the loader its steps read."""
    feed = lead.steps[-1].feed if lead.steps else None
    rows = [e for e in events if isinstance(e, FetchLine) and e.ppid == lead.pid]
    fed = [e for e in rows if e.feed == feed]  # forked workers see the same dataset object
    return fed or rows  # spawned ones unpickled their own copy: a new id


def transform_split(lead: _Lead, events: Sequence[Event]) -> dict[str, Any] | None:
    """``item_cost.split``: the ``transforms`` lines of ``lead`` and its workers, for the loader its steps read
    (any of theirs where none matches: a spawned worker's dataset has a new id), of the pipeline most of them
    timed; None without one."""
    feed = lead.steps[-1].feed if lead.steps else None
    mine = [e for e in events if isinstance(e, TransformsLine) and lead.pid in (e.pid, e.ppid) and any(e.seconds)]
    rows = [e for e in mine if e.feed == feed] or mine
    if not rows:
        return None
    pipeline = Counter((e.where, e.names) for e in rows).most_common(1)[0][0]
    rows = [e for e in rows if (e.where, e.names) == pipeline]
    samples, total = sum(e.samples for e in rows), sum(e.getitem_s for e in rows)
    if not samples or total <= 0:
        return None
    spent = [sum(e.seconds[k] for e in rows) for k in range(len(pipeline[1]))]
    named = [*zip(pipeline[1], spent, strict=True), (REST, max(0.0, total - sum(spent)))]
    ahead = set(itertools.takewhile(lambda name: name in STAGED, pipeline[1])) | {REST}  # before any other step
    parts = [
        {"name": k, "ms": round(1e3 * v / samples, 3), "share": round(min(1.0, v / total), 4), "staged": k in ahead}
        for k, v in named
    ]
    return {
        "method": rows[0].method,
        "pipeline": pipeline[0],
        "batches": len(rows),
        "samples": samples,
        "ms_per_sample": round(1e3 * total / samples, 3),
        "parts": sorted(parts, key=lambda p: -p["share"]),
    }


def split_text(split: dict[str, Any], top: int = 4) -> str:
    """ "GaussianBlur 56%, ColorJitter 20%, read + decode 11%, ..." (largest first)."""
    return ", ".join(f"{p['name']} {p['share']:.0%}" for p in split["parts"][:top])


def split_fix(split: dict[str, Any]) -> str:
    """What the split says to do: the costliest transform named with its share, and what pre-decoding with stage-data
    would remove (the read + decode and fixed resizes: an estimate from their shares, not measured)."""
    parts = split["parts"]
    head = (
        f"where a sample's {split['ms_per_sample']:,.1f} ms go ({split['pipeline']}, {split['samples']} samples "
        f"timed): {split_text(split)}"
    )
    staged = [p for p in parts if p.get("staged", p["name"] == REST)]
    removed = sum(p["share"] for p in staged)
    names = " and ".join(p["name"] for p in staged)
    stage = (
        f"pre-decoding with invoke stage-data (decoded, resized arrays) removes {names}: about {removed:.0%} of a "
        "sample's time (an estimate from these shares, not measured)"
    )
    heavy = next((p for p in parts if p not in staged), None)
    if removed < STAGE_MIN_SHARE:
        stage = f"pre-decoding with invoke stage-data would remove only {names} ({removed:.0%}: an estimate)"
    if heavy is None:
        return f"{head}; {stage}"
    costly = (
        f"{heavy['name']} is the costliest transform ({heavy['share']:.0%}, {heavy['ms']:,.2f} ms a sample): make "
        "it cheaper (smaller inputs, after the crop), drop it, or move it to the GPU"
    )
    return "; ".join([head, costly, stage] if heavy["share"] > removed else [head, stage, costly])


def with_split(verdicts: list[Verdict]) -> list[Verdict]:
    """Each data verdict whose run timed its transforms, with ``split_fix`` after its fix (measured or not)."""
    out = []
    for v in verdicts:
        split = (v.evidence.get("item_cost") or {}).get("split")
        if v.id in ("data-bound", "cpu-starved") and split:
            v = dataclasses.replace(v, fix=f"{v.fix}; {split_fix(split)}")
        out.append(v)
    return out
