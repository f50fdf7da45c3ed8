"""The PNG timeline: GPU and CPU samples over time, the steps as stacked bars, the step-time breakdown as one bar.

Headless: a matplotlib ``Figure`` drawn by the Agg canvas directly (no pyplot state, no display, no backend
selection). Times are seconds since the first sample; phases of the run (warm-up, checkpoint, ...) are shaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks.verify.sampler import Trace
from checks.verify.smoke.figures import PHASES, SHARES

COLOURS = {
    "data_wait": "#d62728",
    "h2d": "#ff7f0e",
    "forward": "#1f77b4",
    "backward": "#17becf",
    "optimizer": "#2ca02c",
    "checkpoint": "#9467bd",
}
_SHADE = {"warmup": "#dddddd", "kernels": "#fde9c9", "checkpoint": "#e5dcf2", "ab": "#d9ecd9", "sweep": "#d9e6f2"}


def draw(
    path: Path,
    trace: Trace,
    title: str,
    gpu: int | None,
    usable_cores: float,
    steps: Sequence[dict[str, Any]] = (),
    warmup: Sequence[dict[str, Any]] = (),
    shares: dict[str, float] | None = None,
    phases: dict[str, list[float]] | None = None,
) -> None:
    """Write the timeline PNG to ``path`` (atomically)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = 2 + bool(steps) + bool(shares)
    heights = [3, 2.5] + ([2.5] if steps else []) + ([1.0] if shares else [])
    fig = Figure(figsize=(12, sum(heights) + 1.2), layout="constrained")
    axes = fig.subplots(rows, 1, height_ratios=heights)
    t0 = trace.rows[0]["t_mono"] if trace.rows else (steps[0]["host_start"] if steps else 0.0)
    t0 = float(t0 or 0.0)
    _gpu_panel(axes[0], trace, gpu, t0)
    _cpu_panel(axes[1], trace, usable_cores, t0)
    if steps:
        _steps_panel(axes[2], steps, warmup, t0)
    for i, ax in enumerate(axes[: 2 + bool(steps)]):
        _shade(ax, phases or {}, t0, label=i == 0)
    if steps:
        axes[2].sharex(axes[0])
    axes[1].sharex(axes[0])
    if shares:
        _breakdown_bar(axes[-1], shares)
    fig.suptitle(title, fontsize=11)
    tmp = path.with_name(f".{path.name}.tmp.png")
    FigureCanvasAgg(fig).print_png(str(tmp))
    tmp.replace(path)


def _xs(trace: Trace, column: str, t0: float) -> tuple[list[float], list[float]]:
    pairs = [(float(r["t_mono"] or 0) - t0, float(v)) for r in trace.rows if (v := r.get(column)) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _gpu_panel(ax: Any, trace: Trace, gpu: int | None, t0: float) -> None:
    ax.set_ylabel("GPU %")
    ax.set_ylim(0, 105)
    if gpu is None:
        ax.text(0.5, 0.5, "no GPU sampled (NVML not available here)", ha="center", va="center", transform=ax.transAxes)
        return
    p = f"gpu{gpu}_"
    ax.plot(*_xs(trace, p + "util_pct", t0), label="utilisation (NVML, time-based)", color="#1f77b4")
    ax.plot(*_xs(trace, p + "mem_util_pct", t0), label="memory controller busy", color="#aec7e8")
    right = ax.twinx()
    used = _xs(trace, p + "mem_used_mib", t0)
    right.plot(used[0], [v / 1024 for v in used[1]], label="memory used (GiB)", color="#8c564b", linestyle="--")
    power = _xs(trace, p + "power_w", t0)
    right.plot(power[0], [v / 10 for v in power[1]], label="power (x10 W)", color="#e377c2", linestyle=":")
    right.set_ylabel("GiB | x10 W")
    ax.legend(loc="upper left", fontsize=7)
    right.legend(loc="upper right", fontsize=7)


def _cpu_panel(ax: Any, trace: Trace, usable_cores: float, t0: float) -> None:
    ax.set_ylabel("CPU %")
    ax.set_ylim(0, 105)
    ax.plot(*_xs(trace, "cpu_pct", t0), label="usable cores, mean", color="#7f7f7f")
    ax.plot(*_xs(trace, "cpu_max_core_pct", t0), label="busiest core", color="#c7c7c7", linewidth=0.8)
    tree = _xs(trace, "tree_cpu_cores", t0)
    ax.plot(
        tree[0], [100 * v / usable_cores for v in tree[1]], label="training processes (% of usable)", color="#d62728"
    )
    workers = _xs(trace, "worker_cpu_cores", t0)
    ax.plot(
        workers[0],
        [100 * v / usable_cores for v in workers[1]],
        label="child processes (DataLoader workers)",
        color="#ff9896",
    )
    ax.plot(*_xs(trace, "iowait_pct", t0), label="iowait", color="#bcbd22", linestyle=":")
    ax.legend(loc="upper left", fontsize=7, ncols=3)


def _steps_panel(ax: Any, steps: Sequence[dict[str, Any]], warmup: Sequence[dict[str, Any]], t0: float) -> None:
    """Stacked phase bars per step at the step's host time; warm-up steps faint (a first step can be 10x longer)."""
    ax.set_ylabel("step (ms)")
    ax.set_xlabel("seconds")
    for group, alpha, label in ((warmup, 0.3, False), (steps, 1.0, True)):
        xs = [float(s["host_start"]) - t0 for s in group]
        widths = [max(1e-4, 0.9 * (float(s["host_end"]) - float(s["host_start"]))) for s in group]
        bottom = [0.0] * len(group)
        for phase in PHASES:
            heights = [1000 * float(s[phase]) for s in group]
            name = phase if label else None
            ax.bar(xs, heights, widths, bottom=bottom, align="edge", color=COLOURS[phase], alpha=alpha, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    top = max((1000 * sum(float(s[p]) for p in PHASES) for s in steps), default=0.0)
    if top > 0:
        ax.set_ylim(0, 1.3 * top)
    ax.legend(loc="upper left", fontsize=7, ncols=5)


def _shade(ax: Any, phases: dict[str, list[float]], t0: float, label: bool = False) -> None:
    for name, colour in _SHADE.items():
        if name in phases:
            a, b = phases[name]
            ax.axvspan(a - t0, b - t0, color=colour, alpha=0.6, zorder=0, linewidth=0)
            if label:
                ax.text(a - t0, 101, name, fontsize=7, va="bottom", color="#555555")


def _breakdown_bar(ax: Any, shares: dict[str, float]) -> None:
    left = 0.0
    for key in SHARES:
        width = shares.get(key, 0.0)
        ax.barh([0], [width], left=left, color=COLOURS[key], label=key)
        if width >= 0.04:
            ax.text(
                left + width / 2, 0, f"{key}\n{100 * width:.0f}%", ha="center", va="center", fontsize=7, color="white"
            )
        left += width
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("share of step time (checkpoints amortised)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9), ncols=6, fontsize=7)
