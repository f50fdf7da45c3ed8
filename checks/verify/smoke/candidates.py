"""The DataLoader alone (child process, torch): its rate at candidate settings, and where a sample's time goes.

Run after the loop when it waited for data, so a fix that is a loader setting is measured before it is advised
(docs/sources.md#loader-sweep: "measured best, not a rule of thumb"; the rules of thumb disagree, and
"use at most 1 worker" once cost a pipeline here 28%). Worker counts are tried on the loop's dataset first and the
in-process one (``num_workers=0``) last, on a dataset opened in this process, so that maps opened here never
travel to workers started later.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from checks.verify.smoke.loop import Feed, to_device

MakeFeed = Callable[[Any, dict[str, Any]], Feed]
COST_SHARE = 0.2  # of verify.loader_probe_s for data_cost; the rest times the candidates (tool-defined)
MIN_CANDIDATE_S = 0.4  # timed seconds per candidate at least, whatever the budget (2 batches at least too)
_START_S = 0.5  # a candidate's workers starting, not counted in its seconds (fork on two cores: ~0.2 s)


def worker_counts(current: int, cores: float) -> list[int]:
    """0, 1, cores-1, cores, 2 x cores and the current count, deduplicated, the current one first."""
    c = max(1, int(cores))
    wanted = [current, 0, 1, c - 1, c, 2 * c]
    return list(dict.fromkeys(w for w in wanted if w >= 0))


def loader_alone(
    make_feed: MakeFeed,
    dataset: Any,
    local: Any,
    loader: dict[str, Any],
    seconds: float,
    cores: float,
    cuda: bool,
    deadline: float = 0.0,
) -> dict[str, Any]:
    """Samples/s of the DataLoader with nothing else to do, at each candidate setting, within ``seconds``.

    Returns the current setting's rate (``samples_s``), the in-process one (``in_process_samples_s``) and every
    candidate as ``{num_workers, pin_memory, samples_s, runs}``. On a GPU each batch is also copied to the device,
    so ``pin_memory`` is timed where it pays (the copy) and where it costs (the pinning); on the CPU it is not
    tried. The fastest and the current setting are timed once more, in the other order, and keep the mean of
    both runs: a neighbour that comes and goes between two candidates' turns cannot pick the advice alone.
    With a ``deadline`` (the whole command's budget, monotonic seconds), a candidate other than the current one
    that would not end by then is not timed (``not_timed``: their worker counts), nor the second runs.
    """
    current, pin = int(loader.get("num_workers") or 0), bool(loader.get("pin_memory")) and cuda
    counts = worker_counts(current, cores)
    each = max(MIN_CANDIDATE_S, seconds / (len(counts) + 2 + (1 if cuda else 0)))
    move = _to_device if cuda else None
    started, rows = time.monotonic(), list[dict[str, Any]]()

    def timed(w: int, pinned: bool) -> float | None:
        return _feed_rate(make_feed, local if w == 0 else dataset, _settings(loader, w, pinned), each, move)

    skipped: list[int] = []

    def room() -> bool:
        return not deadline or time.monotonic() + each + _START_S <= deadline

    for w in sorted(counts, key=lambda w: w == 0):  # in-process last (see the module docstring)
        if w != current and not room():
            skipped.append(w)
            continue
        rows.append({"num_workers": w, "pin_memory": pin, "runs": [timed(w, pin)]})
    if cuda and room():
        top = int(max(rows, key=_rate)["num_workers"])
        rows.append({"num_workers": top, "pin_memory": not pin, "runs": [timed(top, not pin)]})
    best = max(rows, key=_rate)
    now = next(r for r in rows if (r["num_workers"], r["pin_memory"]) == (current, pin))
    for row in [best, now] if best is not now and room() else []:
        row["runs"].append(timed(row["num_workers"], row["pin_memory"]))
    for row in rows:
        runs = [r for r in row["runs"] if r]
        row["samples_s"] = round(sum(runs) / len(runs), 1) if runs else None
    by_workers = {r["num_workers"]: r["samples_s"] for r in rows if r["pin_memory"] == pin}
    out: dict[str, Any] = {"workers": current, "pin_memory": pin, "samples_s": by_workers.get(current)}
    if current:
        out["in_process_samples_s"] = by_workers.get(0)
    out |= {"candidates": rows, "seconds_each": round(each, 2), "wall_s": round(time.monotonic() - started, 2)}
    return out | ({"not_timed": skipped} if skipped else {})


def _rate(row: dict[str, Any]) -> float:
    runs = [r for r in row["runs"] if r]
    return sum(runs) / len(runs) if runs else 0.0


def _settings(loader: dict[str, Any], workers: int, pin: bool) -> dict[str, Any]:
    """The loop's loader keywords with another worker count and pin_memory (worker-only keys dropped at 0)."""
    kw = {k: v for k, v in loader.items() if k not in ("persistent_workers", "prefetch_factor")}
    kw |= {"num_workers": workers, "pin_memory": pin}
    if workers:
        kw |= {"persistent_workers": True, "prefetch_factor": int(loader.get("prefetch_factor") or 2)}
    return kw


def _to_device(batch: Any) -> None:
    """The copy the loop makes of a batch's inputs (every tensor in them, as ``loop.to_device`` moves them)."""
    to_device(batch[0] if isinstance(batch, (list, tuple)) else batch, torch.device("cuda"))
    torch.cuda.synchronize()


def _feed_rate(
    make_feed: MakeFeed, dataset: Any, loader: dict[str, Any], seconds: float, move: Callable[[Any], None] | None
) -> float | None:
    """Samples/s over at least ``seconds`` after the worker start-up and the batches prefetched meanwhile.

    Workers hand batches over in turn, and on busy cores they finish in bursts; so the window runs from one
    batch's arrival to that of a batch whole rounds later (a multiple of the worker count: the same worker's
    batch one period on), whatever the phase of the bursts.
    """
    workers = int(loader.get("num_workers") or 0)
    ready = workers * int(loader.get("prefetch_factor") or 2) if workers else 0
    feed = make_feed(dataset, loader)
    try:
        for _ in range(1 + ready):
            feed.next()
        start, rounds = time.monotonic(), max(1, workers)
        batches = samples = 0
        while (elapsed := time.monotonic() - start) < seconds or batches < 2 or batches % rounds:
            batch = feed.next()
            if move is not None:
                move(batch)
            samples += _samples(batch)
            batches += 1
        return round(samples / elapsed, 1) if elapsed > 0 else None
    finally:
        feed.close()


def _samples(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if hasattr(first, "shape") else len(first)


# --- where a sample's time goes -------------------------------------------------------------------------------

TRANSFORM_ATTRS = ("transform", "transforms")  # torchvision datasets keep the pipeline in ``transform``
REST = "read + decode"  # what __getitem__ spends outside the timed transforms


def data_cost(dataset: Any, seconds: float) -> dict[str, Any]:
    """Per-sample milliseconds of ``dataset[i]`` in this process, split into each transform and the rest.

    A ``Compose``-like pipeline (an object with a ``.transforms`` list, as torchvision's) found on the dataset is
    timed step by step; a single callable transform as one step; without either, ``__getitem__`` as a whole.
    """
    found = _pipeline(dataset)
    spent: list[float] = []
    with _timed(found, spent) as names:
        total, n = 0.0, 0
        stride = max(1, len(dataset) // 997)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or n < 3:
            a = time.perf_counter()
            dataset[(n * stride) % len(dataset)]
            total += time.perf_counter() - a
            n += 1
    method = "getitem" if found is None else "compose" if isinstance(found[1], list) else "transform"
    return {"method": method, "samples": n, "per_sample_ms": round(1e3 * total / n, 3)} | {
        "parts": _parts(names, spent, total, n, method)
    }


def _parts(names: list[str], spent: list[float], total: float, n: int, method: str) -> list[dict[str, Any]]:
    rest = max(0.0, total - sum(spent))
    rows = [(name, s) for name, s in zip(names, spent, strict=True)] + [
        (REST if method != "getitem" else "__getitem__", rest)
    ]
    out = [{"name": k, "ms": round(1e3 * s / n, 3), "share": round(s / total, 4) if total else 0.0} for k, s in rows]
    return sorted(out, key=lambda r: -r["share"])


def _pipeline(dataset: Any, depth: int = 0) -> tuple[Any, Any] | None:
    """(owner, list of steps) for a Compose-like pipeline, (owner, attribute name) for one transform, or None."""
    for attr in TRANSFORM_ATTRS:
        t = getattr(dataset, attr, None)
        if t is None or not callable(t):
            continue
        steps = getattr(t, "transforms", None)
        if isinstance(steps, list) and steps:
            return t, steps
        return dataset, attr
    inner = getattr(dataset, "dataset", None)  # Subset and similar wrappers
    return _pipeline(inner, depth + 1) if inner is not None and depth < 3 else None


class _Step:
    """A transform that adds its own time to ``spent[k]``."""

    def __init__(self, inner: Any, spent: list[float], k: int) -> None:
        self.inner, self.spent, self.k = inner, spent, k

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        a = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.spent[self.k] += time.perf_counter() - a


@contextmanager
def _timed(found: tuple[Any, Any] | None, spent: list[float]) -> Iterator[list[str]]:
    """Swap each step for a timing wrapper, and put the originals back afterwards."""
    if found is None:
        yield []
        return
    owner, steps = found
    if isinstance(steps, list):
        original = list(steps)
        spent.extend(0.0 for _ in original)
        steps[:] = [_Step(t, spent, k) for k, t in enumerate(original)]  # in place: the pipeline keeps its list
        try:
            yield [type(t).__name__ for t in original]
        finally:
            steps[:] = original
        return
    original = getattr(owner, steps)
    spent.append(0.0)
    setattr(owner, steps, _Step(original, spent, 0))
    try:
        yield [type(original).__name__]
    finally:
        setattr(owner, steps, original)
