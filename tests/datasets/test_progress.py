"""stage-data's progress where stderr is not a terminal: a line every few seconds through ``say``, during the work."""

from __future__ import annotations

import time
from pathlib import Path

from datasets.progress import Lines
from datasets.stage import stage
from tests.datasets.jobs import request


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_few_seconds_with_rate_and_time_left_then_done() -> None:
    clock, said = _Clock(), list[str]()
    bar = Lines(said.append, every_s=5.0, clock=clock).bar("decode", 1000, "img")
    for _ in range(10):  # 100 images a second, updated once a second
        clock.now += 1.0
        bar.update(100)
    clock.now += 2.0
    bar.close()
    assert said == [
        "stage-data: decode 500 of 1,000 img (50%), 100 img/s, about 5 s left",
        "stage-data: decode 1,000 of 1,000 img (100%), 100 img/s, about 0 s left",
        "stage-data: decode done: 1,000 img in 12 s",
    ]


def test_bytes_read_in_binary_units_and_a_quick_step_says_nothing() -> None:
    clock, said = _Clock(), list[str]()
    lines = Lines(said.append, every_s=5.0, clock=clock)
    quick = lines.bar("hash", 10, "B")
    clock.now += 1.0
    quick.update(10)
    quick.close()
    assert said == []  # done within the interval: no line, no "done" line
    bar = lines.bar("sha256", 4 * 1024**3, "B", initial=1024**3)  # resumed at 1 GiB
    clock.now += 6.0
    bar.moveto(2 * 1024**3)
    assert said == ["stage-data: sha256 2.0 GiB of 4.0 GiB (50%), 170.7 MiB/s, about 12 s left"]


def test_a_real_staging_says_how_far_it_is_while_it_decodes(big_tree: Path, tmp_path: Path) -> None:
    heard: list[tuple[float, str]] = []
    progress = Lines(lambda line: heard.append((time.monotonic(), line)), every_s=0.05)
    out = stage(request(big_tree, tmp_path / "ds", workers=1, max_rejects="10"), progress=progress)
    returned = time.monotonic()
    decoding = [(t, line) for t, line in heard if line.startswith("stage-data: decode ") and " of " in line]
    assert decoding, [line for _, line in heard]
    assert out.manifest.contents.counts.staged == 300
    # said while it worked: a count short of the whole, before the step's own "done" line and the return
    partial = [(t, line) for t, line in decoding if not line.startswith("stage-data: decode 305 of 305")]
    assert partial and partial[0][0] < returned, decoding
    done = [t for t, line in heard if line.startswith("stage-data: decode done")]
    assert done and partial[0][0] < done[0], heard
