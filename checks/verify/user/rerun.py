"""Whether re-runs of the command can fit the seconds left, before any is started.

Each measured fix (the loader's settings, the model-side changes) compares re-runs of the command: at least one of
the unchanged command and one changed, each paying a process start and its warm-up before its measured steps. On a
slow or crowded box a step can take seconds (the tool's script on 224 px photos beside a CPU hog per core: 11.6 s),
and re-runs that cannot reach their measured steps only spend the budget; they are skipped at once, saying why.
"""

from __future__ import annotations

START_S = (
    3.0  # a re-run's start: torch's import (about 2 CPU-s on the 2-core box) and the script's set-up. Tool-defined.
)
RUNS = 2  # the fewest a comparison takes: the unchanged command and one change


def too_slow(step_s: float | None, steps: int, seconds: float) -> str:
    """Why ``RUNS`` re-runs of ``steps`` steps (warm-up included) at ``step_s`` cannot fit ``seconds``; "" when
    they can, or when the pace is unknown."""
    if not step_s or step_s <= 0:
        return ""
    need = RUNS * (START_S + steps * step_s)
    if need <= seconds:
        return ""
    return (
        f"{RUNS} re-runs of {steps} steps at {step_s:.2f} s a step need about {need:.0f} s, more than the "
        f"{max(seconds, 0.0):.0f} s left"
    )
