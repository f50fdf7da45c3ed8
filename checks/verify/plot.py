"""The PNG timeline: GPU and CPU samples over time, the steps as stacked bars, the step-time breakdown as one bar.

Headless: a matplotlib ``Figure`` drawn by the Agg canvas directly (no pyplot state, no display, no backend
selection). Times are seconds since the first sample; phases of the run (warm-up, checkpoint, ...) are shaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from checks.verify.contract import Step
from checks.verify.figures import PHASES, SHARES
from checks.verify.sampler import Trace

COLOURS = {
    "data_wait": "#d62728",
    "h2d": "#ff7f0e",
    "forward": "#1f77b4",
    "backward": "#17becf",
    "optimizer": "#2ca02c",
    "checkpoint": "#9467bd",
    "comm": "#e377c2",  # --nproc: the exposed gradient exchange, taken out of backward
}
# The run's phases, shaded and named on the top panel: the warm-up steps, and what the script marked with
# ``phase(name)`` (its ``phase`` lines; a name not here gets ``_OTHER``).
_SHADE = {"warmup": "#dddddd", "checkpoint": "#e5dcf2", "eval": "#d9ecd9", "save": "#e5dcf2"}
_OTHER = "#efefd0"


def draw(path: Path, trace: Trace, title: str, gpu: int | None, usable_cores: float, **details: Any) -> None:
    """Write the timeline PNG to ``path`` (atomically); ``details`` and what it shows: see ``figure``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure(trace, title, gpu, usable_cores, **details)
    tmp = path.with_name(f".{path.name}.tmp.png")
    FigureCanvasAgg(fig).print_png(str(tmp))
    tmp.replace(path)


def figure(
    trace: Trace,
    title: str,
    gpu: int | None,
    usable_cores: float,
    steps: Sequence[Step] = (),
    warmup: Sequence[Step] = (),
    shares: dict[str, float] | None = None,
    phases: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    step_s: float | None = None,
    samples_per_s: float | None = None,
    comm_share: float | None = None,
) -> Any:
    """Build the timeline as a matplotlib ``Figure`` (no pyplot state).

    Only what was recorded is drawn: no GPU panel without GPU samples, no line for a series without values.
    ``step_s`` and ``samples_per_s`` (the report's figures) go into the title; without them the title gives the
    median of ``steps``.
    """
    from matplotlib.figure import Figure

    gpu = gpu if gpu is not None and trace.values(f"gpu{gpu}_util_pct") else None
    panels = [*(["gpu"] if gpu is not None else []), "cpu", *(["steps"] if steps else [])]
    heights = [_HEIGHTS[p] for p in panels] + ([1.0] if shares else [])
    fig = Figure(figsize=(13, sum(heights) + 1.4), layout="constrained")
    axes = list(fig.subplots(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0])
    t0 = trace.rows[0]["t_mono"] if trace.rows else (steps[0].host_start if steps else 0.0)
    t0 = float(t0 or 0.0)
    timed = dict(zip(panels, axes, strict=False))
    if gpu is not None:
        _gpu_panel(timed["gpu"], trace, gpu, t0)
    _cpu_panel(timed["cpu"], trace, usable_cores, t0)
    if steps:
        _steps_panel(timed["steps"], steps, warmup, t0)
    for i, ax in enumerate(timed.values()):
        _shade(ax, phases or {}, t0, label=i == 0)
        if i:
            ax.sharex(axes[0])
    axes[len(panels) - 1].set_xlabel("seconds since the first sample")
    if shares:
        _breakdown_bar(axes[-1], with_comm(shares, comm_share))
    fig.suptitle(_title(title, gpu, steps, step_s, samples_per_s), fontsize=11)
    return fig


_HEIGHTS = {"gpu": 3.0, "cpu": 2.5, "steps": 2.5}


def _title(title: str, gpu: int | None, steps: Sequence[Step], step_s: float | None, rate: float | None) -> str:
    """The verdict title with the run's headline figures, and a note when no GPU was sampled."""
    if step_s is None and steps:
        totals = sorted(s.total for s in steps)
        step_s = totals[len(totals) // 2]
    figures = [f"step {1000 * step_s:,.0f} ms" if step_s else "", f"{rate:,.1f} samples/s" if rate else ""]
    text = ", ".join(f for f in figures if f)
    note = "" if gpu is not None else " (no GPU sampled)"
    return f"{title}{note}" + (f"\n{text}" if text else "")


def _xs(trace: Trace, column: str, t0: float) -> tuple[list[float], list[float]]:
    pairs = [(float(r["t_mono"] or 0) - t0, float(v)) for r in trace.rows if (v := r.get(column)) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _line(ax: Any, trace: Trace, column: str, t0: float, scale: float = 1.0, **style: Any) -> list[float]:
    """Plot one recorded series (nothing for a series without values); return the plotted values."""
    xs, ys = _xs(trace, column, t0)
    if not xs:
        return []
    values = [y * scale for y in ys]
    ax.plot(xs, values, **style)
    return values


def _legend_outside(ax: Any, handles: list[Any] | None = None, offset: float = 1.01) -> None:
    """The legend right of the axes, so it never covers lines at 100%."""
    if handles is None:
        handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(offset, 1.0), fontsize=7, borderaxespad=0)


def _percent_limits(ax: Any, values: list[float]) -> None:
    """0-105 %, or up to the highest value with headroom: a line above 100 % is drawn, not clipped."""
    ax.set_ylim(0, max(105.0, 1.08 * max(values, default=0.0)))


def _gpu_panel(ax: Any, trace: Trace, gpu: int, t0: float) -> None:
    ax.set_ylabel("GPU %")
    p = f"gpu{gpu}_"
    values = _line(ax, trace, p + "util_pct", t0, label="utilisation (NVML, time-based)", color="#1f77b4")
    values += _line(ax, trace, p + "mem_util_pct", t0, label="memory controller busy", color="#aec7e8")
    _percent_limits(ax, values)
    right = ax.twinx()
    _line(right, trace, p + "mem_used_mib", t0, 1 / 1024, label="memory used (GiB)", color="#8c564b", linestyle="--")
    _line(right, trace, p + "power_w", t0, 1 / 10, label="power (x10 W)", color="#e377c2", linestyle=":")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    if right.get_legend_handles_labels()[0]:
        right.set_ylabel("GiB | x10 W")
        right.set_ylim(bottom=0)
        _legend_outside(right, handles, offset=1.07)
    else:
        right.set_yticks([])
        _legend_outside(ax, handles)


def _cpu_panel(ax: Any, trace: Trace, usable_cores: float, t0: float) -> None:
    ax.set_ylabel("CPU %")
    per_core = 100 / usable_cores if usable_cores else 100.0
    values = _line(ax, trace, "cpu_pct", t0, label="usable cores, mean", color="#7f7f7f")
    values += _line(ax, trace, "cpu_max_core_pct", t0, label="busiest core", color="#c7c7c7", linewidth=0.8)
    style = {"label": "training processes (% of usable)", "color": "#d62728"}
    values += _line(ax, trace, "tree_cpu_cores", t0, per_core, **style)
    style = {"label": "child processes (DataLoader workers)", "color": "#ff9896"}
    values += _line(ax, trace, "worker_cpu_cores", t0, per_core, **style)
    values += _line(ax, trace, "iowait_pct", t0, label="iowait", color="#bcbd22", linestyle=":")
    _percent_limits(ax, values)
    _legend_outside(ax)


def _steps_panel(ax: Any, steps: Sequence[Step], warmup: Sequence[Step], t0: float) -> None:
    """Stacked phase bars per step at the step's host time; warm-up steps faint (a first step can be 10x longer)."""
    ax.set_ylabel("step (ms)")
    for group, alpha, label in ((warmup, 0.3, False), (steps, 1.0, True)):
        xs = [s.host_start - t0 for s in group]
        widths = [max(1e-4, 0.9 * (s.host_end - s.host_start)) for s in group]
        bottom = [0.0] * len(group)
        for phase in PHASES:
            heights = [1000 * float(getattr(s, phase)) for s in group]
            name = phase if label else None
            ax.bar(xs, heights, widths, bottom=bottom, align="edge", color=COLOURS[phase], alpha=alpha, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    top = max((1000 * s.total for s in steps), default=0.0)
    if top > 0:
        ax.set_ylim(0, 1.3 * top)
    _legend_outside(ax)


def _shade(ax: Any, phases: Mapping[str, Sequence[tuple[float, float]]], t0: float, label: bool = False) -> None:
    """Each phase's spans shaded; its name above the first span (on the top panel)."""
    for name, spans in phases.items():
        for k, (a, b) in enumerate(spans):
            ax.axvspan(a - t0, b - t0, color=_SHADE.get(name, _OTHER), alpha=0.6, zorder=0, linewidth=0)
            if label and k == 0:  # just above the axes (x in data, y in axes units), clear of the lines
                ax.text(
                    a - t0, 1.01, name, fontsize=7, va="bottom", color="#555555", transform=ax.get_xaxis_transform()
                )


def with_comm(shares: dict[str, float], comm: float | None) -> dict[str, float]:
    """The shares with the exposed gradient exchange (``measurements.ddp.comm_share``) drawn apart: it is measured
    inside backward, where DDP waits for the all-reduce, so it comes out of backward's share."""
    if not comm or "backward" not in shares:
        return shares
    taken = min(float(comm), shares["backward"])
    return {**shares, "backward": shares["backward"] - taken, "comm": taken}


def _breakdown_bar(ax: Any, shares: dict[str, float]) -> None:
    left = 0.0
    for key in (*SHARES, "comm"):
        width = shares.get(key, 0.0)
        if key == "comm" and not width:
            continue
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
