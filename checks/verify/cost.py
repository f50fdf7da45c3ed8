"""Time into money: the cost of an epoch at the measured throughput, and of each share of it that is lost.

docs/sources.md#cost-per-epoch: ``$ / epoch = price/h x (steps_per_epoch x step time, checkpoints amortised) / 3600``,
and the saving a fix would bring ("data wait costs $N per epoch"). The seed article §2.3 asks for exactly this
figure ("what does one epoch cost", not "what does an hour cost"). Pure functions.
"""

from __future__ import annotations

from typing import Any

from checks.units import duration, money

LOST_SHARES = ("data_wait", "h2d", "checkpoint")  # time during which the device does no model math


def cost(
    price_per_hour: float,
    step_s: float,
    samples_per_step: int,
    shares: dict[str, float],
    epoch_samples: int | None,
    tokens_per_sample: int = 0,
) -> dict[str, Any]:
    """Cost per epoch (when the dataset size is known), per million samples (and tokens), and per lost share."""
    per_sample_s = step_s / samples_per_step
    out: dict[str, Any] = {
        "price_per_hour": price_per_hour,
        "per_million_samples": round(price_per_hour * per_sample_s * 1e6 / 3600, 4),
    }
    if tokens_per_sample:
        out["per_million_tokens"] = round(out["per_million_samples"] / tokens_per_sample, 6)
    unit, unit_cost = "per_million_samples", out["per_million_samples"]
    if epoch_samples:
        steps = epoch_samples // samples_per_step
        seconds = steps * step_s
        out |= {
            "epoch_steps": steps,
            "epoch_hours": round(seconds / 3600, 4),
            "per_epoch": round(price_per_hour * seconds / 3600, 4),
        }
        unit, unit_cost = "per_epoch", out["per_epoch"]
    out["lost"] = {k: round(shares.get(k, 0.0) * unit_cost, 4) for k in LOST_SHARES}
    out["lost_unit"] = unit
    return out


def describe(c: dict[str, Any]) -> str:
    """One line: the epoch (or million-sample) cost and the biggest avoidable part of it."""
    unit = "epoch" if c["lost_unit"] == "per_epoch" else "1M samples"
    total = c.get("per_epoch", c["per_million_samples"])
    text = f"{money(total)} per {unit} at ${c['price_per_hour']:g}/h"
    if "epoch_hours" in c:
        text += f" ({duration(c['epoch_hours'])})"
    worst = max(c["lost"], key=lambda k: c["lost"][k])
    if c["lost"][worst] >= 0.01 * total and c["lost"][worst] > 0:
        text += f"; {worst.replace('_', ' ')} costs {money(c['lost'][worst])} of it"
    return text
