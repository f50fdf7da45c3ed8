"""The verify/watch PNG: only what was recorded, legends clear of the lines, nothing clipped, figures in the title."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from checks.verify.contract import Step
from checks.verify.plot import draw, figure
from checks.verify.sampler import Trace

pytest.importorskip("matplotlib")


def _trace(gpu: bool, tree: bool = True, n: int = 60) -> Trace:
    rows = []
    for i in range(n):
        row: dict[str, float | None] = {
            "t_mono": 100 + i * 0.1,
            "cpu_pct": 60 + 30 * math.sin(i / 7),
            "cpu_max_core_pct": 100.0,
            "iowait_pct": 2.0,
        }
        if tree:  # 2.3 busy cores of 2 usable: the training processes run at 115 % of usable
            row |= {"tree_cpu_cores": 2.3, "worker_cpu_cores": 1.0}
        if gpu:
            row |= {
                "gpu0_util_pct": 100.0,
                "gpu0_mem_util_pct": 55.0,
                "gpu0_mem_used_mib": 40_000.0,
                "gpu0_power_w": 650.0,
            }
        rows.append(row)
    return Trace(rows)


STEPS = [Step(0.02, 0.01, 0.06, 0.12, 0.02, host_start=101 + 0.3 * i, host_end=101.25 + 0.3 * i) for i in range(10)]
SHARES = {"data_wait": 0.1, "h2d": 0.05, "forward": 0.26, "backward": 0.52, "optimizer": 0.07, "checkpoint": 0.0}


def _rendered(fig: Any) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _time_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.get_ylabel() in ("GPU %", "CPU %", "step (ms)")]


def _labels(fig: Any) -> set[str]:
    return {line.get_label() for ax in fig.axes for line in ax.get_lines()}


@pytest.mark.slow
def test_no_gpu_panel_on_a_machine_without_one() -> None:
    fig = figure(_trace(gpu=False), "invoke verify: data-bound", None, 2.0, STEPS, shares=SHARES)
    assert [ax.get_ylabel() for ax in _time_axes(fig)] == ["CPU %", "step (ms)"]
    assert "no GPU sampled" in fig.get_suptitle()
    # a GPU index with no samples behind it is no GPU either
    assert "GPU %" not in [ax.get_ylabel() for ax in figure(_trace(gpu=False), "t", 0, 2.0).axes]


@pytest.mark.slow
@pytest.mark.parametrize("gpu", [0, None])
def test_legends_sit_outside_the_axes_so_lines_at_100_percent_stay_visible(gpu: int | None) -> None:
    fig = figure(_trace(gpu=gpu is not None), "invoke verify: gpu-bound", gpu, 2.0, STEPS, shares=SHARES)
    renderer = _rendered(fig)
    for ax in _time_axes(fig):
        legends = [a.get_legend() for a in fig.axes if a.get_legend() and a.bbox.bounds[1] == ax.bbox.bounds[1]]
        assert legends, ax.get_ylabel()
        for legend in legends:
            box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.x0 >= area.x1 or box.y1 <= area.y0, f"{ax.get_ylabel()} legend covers its axes"


def test_training_process_line_is_not_clipped_above_100_percent() -> None:
    fig = figure(_trace(gpu=False), "t", None, 2.0)
    [cpu] = _time_axes(fig)
    [tree] = [line for line in cpu.get_lines() if line.get_label().startswith("training processes")]
    assert max(tree.get_ydata()) == pytest.approx(115.0)
    assert cpu.get_ylim()[1] > 115.0


def test_title_carries_step_time_and_samples_per_second() -> None:
    fig = figure(_trace(gpu=True), "invoke verify: gpu-bound", 0, 2.0, STEPS, step_s=0.2345, samples_per_s=1234.5)
    assert "invoke verify: gpu-bound" in fig.get_suptitle()
    assert "step 234 ms" in fig.get_suptitle() and "1,234.5 samples/s" in fig.get_suptitle()
    # without the report's figures: the median step of the run
    assert "step 230 ms" in figure(_trace(gpu=True), "t", 0, 2.0, STEPS).get_suptitle()


def test_watch_png_has_an_x_label_and_only_the_series_it_recorded() -> None:
    fig = figure(_trace(gpu=False, tree=False), "invoke watch: cpu-bound", None, 2.0)
    [cpu] = _time_axes(fig)
    assert cpu.get_xlabel() == "seconds since the first sample"
    assert _labels(fig) == {"usable cores, mean", "busiest core", "iowait"}
    legend = cpu.get_legend()
    assert legend is not None and {t.get_text() for t in legend.get_texts()} == _labels(fig)


@pytest.mark.slow
def test_draw_writes_the_png_atomically(tmp_path: Path) -> None:
    out = tmp_path / "verify.png"
    draw(
        out,
        _trace(gpu=True),
        "invoke verify: gpu-bound",
        0,
        2.0,
        steps=STEPS,
        shares=SHARES,
        phases={"warmup": [(100.0, 101.0)]},
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["verify.png"]


def test_an_nproc_run_draws_its_exposed_exchange_and_names_the_phases_once_each() -> None:
    """Once drawn wrong: a comm-bound --nproc title over a bar with no comm segment. The script's phases (its
    ``phase("eval")`` lines) are shaded every time they ran and named once; a name without its own colour too."""
    from checks.verify.plot import with_comm

    shares = with_comm(SHARES, 0.3)
    assert shares["comm"] == 0.3 and math.isclose(shares["backward"], 0.22)
    assert math.isclose(sum(shares.values()), sum(SHARES.values()))
    assert with_comm(SHARES, None) == SHARES
    phases = {"warmup": [(101.0, 101.6)], "eval": [(104.0, 105.0), (106.0, 106.5)], "gather": [(107.0, 107.2)]}
    fig = figure(_trace(gpu=False), "invoke verify: comm-bound", None, 2.0, STEPS, (), SHARES, phases, comm_share=0.3)
    _rendered(fig)
    bar = fig.axes[-1]
    assert "comm\n30%" in {t.get_text() for t in bar.texts}
    named = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(n for n in named if n in phases) == ["eval", "gather", "warmup"]
    assert len(fig.axes[0].patches) == 4  # every span shaded, eval twice
