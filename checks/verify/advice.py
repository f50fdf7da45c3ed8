"""Measured fixes: the loader setting that measured fastest, where a sample's time goes, and what each fix can buy.

Pure: the child's ``loader_alone`` and ``data_cost`` (``checks.verify.smoke.candidates``) in, advice and text out.
A loader setting is named only when it measured faster than the current one by ``verify.advice_min_gain``; a fix
that cannot be measured here (more cores, a faster disk) is given as an estimate and says from what.

``measurements.advice`` (the contract scripts read): ``{"num_workers", "pin_memory", "measured_samples_s",
"current_samples_s", "faster", "gain"}``; ``num_workers``/``pin_memory`` are the current setting when nothing
measured faster (``faster`` false), so applying them is always safe.
"""

from __future__ import annotations

from typing import Any

REST = "read + decode"  # candidates.REST: __getitem__ outside the timed transforms (what pre-decoding removes)


def loader_advice(alone: dict[str, Any] | None, min_gain: float) -> dict[str, Any] | None:
    """The fastest measured candidate when it beats the current setting by ``min_gain``; else the current one.

    None when no candidate was measured (the probe was off, did not run, or failed).
    """
    rows = [r for r in (alone or {}).get("candidates") or [] if r.get("samples_s")]
    current = (alone or {}).get("samples_s")
    if not rows or not current:
        return None
    best = max(rows, key=lambda r: r["samples_s"])
    faster = best["samples_s"] >= (1 + min_gain) * current
    pick = best if faster else {"num_workers": alone["workers"], "pin_memory": alone["pin_memory"]}  # type: ignore[index]
    return {
        "num_workers": pick["num_workers"],
        "pin_memory": pick["pin_memory"],
        "measured_samples_s": best["samples_s"] if faster else current,
        "current_samples_s": current,
        "faster": faster,
        "gain": round(best["samples_s"] / current, 3),
    }


def setting(advice: dict[str, Any], pin_now: bool) -> str:
    """``num_workers=N`` (and ``pin_memory=...`` when it changes)."""
    pin = f", pin_memory={advice['pin_memory']}" if advice["pin_memory"] != pin_now else ""
    return f"num_workers={advice['num_workers']}{pin}"


def measured_fix(advice: dict[str, Any], workers: int, pin_now: bool, min_gain: float) -> str:
    """The loader part of a fix: the measured setting with both rates, or that none measured faster."""
    cur = f"{advice['current_samples_s']:,.0f} with the current {workers} worker(s)"
    if advice["faster"]:
        return (
            f"use {setting(advice, pin_now)}: measured {advice['measured_samples_s']:,.0f} samples/s from the "
            f"DataLoader alone against {cur}"
        )
    return (
        f"no loader setting measured {100 * min_gain:.0f}% faster than {cur} (best {advice['gain']:.2f}x), so "
        "keep num_workers; the per-sample cost is the limit"
    )


def cost_parts(cost: dict[str, Any] | None, top: int = 4) -> str:
    """ "GaussianBlur 56%, ColorJitter 20%, read + decode 11%" (largest first), or ""."""
    parts = (cost or {}).get("parts") or []
    return ", ".join(f"{p['name']} {100 * p['share']:.0f}%" for p in parts[:top])


def cost_fix(cost: dict[str, Any] | None) -> str:
    """What pre-decoding (stage-data) removes and what it leaves, from the measured split; "" when not measured."""
    if not cost or not cost.get("parts"):
        return ""
    ms = f"{cost['per_sample_ms']:.1f} ms per sample"
    if cost.get("method") == "getitem":
        return (
            f"__getitem__ takes {ms} (no Compose-like transform found to split it); pre-decoding "
            "(invoke stage-data) helps only as far as that time is reading and decoding"
        )
    rest = next((p["share"] for p in cost["parts"] if p["name"] == REST), 0.0)
    heavy = next((p for p in cost["parts"] if p["name"] != REST), None)
    text = f"{ms}: {cost_parts(cost)}; pre-decoding (invoke stage-data) saves at most ~{100 * rest:.0f}%"
    if heavy is not None and heavy["share"] > rest:
        text += f"; make {heavy['name']} cheaper, drop it or move the augmentation to the GPU"
    return text


def cores_estimate(data_wait: float) -> str:
    """More cores cannot be measured on this box: the bound from the data-wait share (Amdahl)."""
    return (
        f"more cores per GPU: an estimate from the data-wait share, not measured here: at most "
        f"-{100 * data_wait:.0f}% step time"
    )


def disk_estimate(data_wait: float) -> str:
    """A faster disk cannot be measured here either: the same bound."""
    return (
        "copy the dataset to local NVMe or /dev/shm first (invoke stage-data); pack small files into arrays: an "
        f"estimate from the data-wait share, not measured here: at most -{100 * data_wait:.0f}% step time"
    )
