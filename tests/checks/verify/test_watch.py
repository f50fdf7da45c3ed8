"""``invoke watch --pid`` on a real short-lived process: it stops when the process exits, judges only its life,
and its evidence carries what was sampled even without NVML; a cant-tell never ends in "ready to train"."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from checks.cli.terminal import LiveLine
from checks.config import make_config
from checks.render import call_to_action
from checks.result import Report
from checks.verify import watch
from checks.verify.sampler import Trace
from checks.verify.watch import Watched

CFG = make_config().verify
LIFE_S = 1.5  # the child burns one core this long, then exits


@pytest.fixture
def short_lived() -> Iterator[subprocess.Popen[bytes]]:
    code = f"import time\nt = time.monotonic()\nwhile time.monotonic() - t < {LIFE_S}: pass"
    proc = subprocess.Popen([sys.executable, "-c", code])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.slow
def test_watch_stops_when_the_watched_process_exits(short_lived: subprocess.Popen[bytes]) -> None:
    cores, _ = watch.usable_here()
    start = time.monotonic()
    w = watch.sample(20, short_lived.pid, cores, CFG)
    took = time.monotonic() - start
    assert w.exited_after_s is not None and LIFE_S - 0.3 <= w.exited_after_s <= LIFE_S + 2.5, w.exited_after_s
    assert took < LIFE_S + 4, took  # not the 20 s asked
    found = watch.verdicts(w, CFG, cores)
    results, m = watch.results(w, found, cores, "w.csv")
    assert m["sampler"]["seconds"] <= w.exited_after_s + 0.2  # judged over its life, no idle samples after it
    assert "exited after" in results[0].summary
    ev = found[0].evidence
    assert ev["pid"] == short_lived.pid and ev["samples"] >= 5 and ev["exited_after_s"] == w.exited_after_s
    assert ev["tree_cpu_cores_max"] is not None and ev["tree_cpu_cores_max"] >= 0.2  # it burnt a core (shared)


def test_cant_tell_is_a_warn_with_the_sampled_cpu_and_never_ready_to_train() -> None:
    rows: list[dict[str, float | None]] = [
        {"t_mono": 100.0 + 0.1 * i, "cpu_pct": 60.0, "iowait_pct": 0.0, "tree_cpu_cores": 1.2, "workers": 2.0}
        for i in range(10)
    ]
    w = Watched(Trace(rows, 0.1), None, "NVML library not found", False, 4242, 0.9)
    found = watch.verdicts(w, CFG, 2.0)
    assert found[0].id == "cant-tell" and "used a median 1.20 of 2 usable cores" in found[0].summary
    assert found[0].severity == "warn"  # the row above it is a warn
    assert found[0].evidence["tree_cpu_cores_p50"] == 1.2 and found[0].evidence["workers_max"] == 2.0
    results, _ = watch.results(w, found, 2.0, "w.csv")
    assert results[1].status.value == "warn"
    action = call_to_action(Report("host", "live", tuple(results), {}))
    assert "ready to train" not in action and "run watch on the GPU machine" in action


def test_a_box_saturated_by_another_process_is_cpu_contended() -> None:
    # The watched tree uses 0.4 of 2 usable cores while the machine's cores are 95% busy: someone else's load.
    rows: list[dict[str, float | None]] = [
        {"t_mono": 100.0 + 0.1 * i, "cpu_pct": 95.0, "iowait_pct": 0.0, "tree_cpu_cores": 0.4, "workers": 0.0}
        for i in range(10)
    ]
    w = Watched(Trace(rows, 0.1), None, "NVML library not found", False, 4242, None)
    found = watch.verdicts(w, CFG, 2.0)
    assert [v.id for v in found] == ["cant-tell", "cpu-contended"]
    assert "95% busy, the training processes used 20%" in found[1].summary
    mine = [r | {"tree_cpu_cores": 1.9} for r in rows]  # the busy cores are its own: no neighbour
    assert [v.id for v in watch.verdicts(Watched(Trace(mine, 0.1), None, "x", False, 4242), CFG, 2.0)] == ["cant-tell"]


# --- what watch shows while it samples ---------------------------------------------------------------------------


@pytest.mark.slow
def test_progress_lines_arrive_while_it_samples() -> None:
    cores, _ = watch.usable_here()
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    w = watch.sample(3.2, None, cores, CFG, progress=lambda line: seen.append((time.monotonic(), line)))
    end = time.monotonic()
    assert w.trace.rows
    times = [t - start for t, _ in seen]
    assert len(seen) >= 2 and times[0] < 1.6 and seen[0][0] < end - 1.0, times  # during the work, not at its end
    assert all(b - a >= watch.PROGRESS_EVERY_S - 0.05 for a, b in itertools.pairwise(times)), times
    first = seen[0][1]
    assert first.startswith("watch: 1 of 3.2 s, ") and first.endswith("s left") and "CPU " in first, first


def test_progress_line_names_the_busiest_gpu_and_what_is_left() -> None:
    rows: list[dict[str, float | None]] = [
        {"t_mono": float(i), "gpu0_util_pct": 10.0, "gpu1_util_pct": 90.0, "cpu_pct": 40.0} for i in range(5)
    ]
    line = watch.progress_line(rows, 12.4, 60, None)
    assert line == "watch: 12 of 60 s, 5 samples: GPU 1 busy 90%, CPU 40% (medians so far); 48 s left"
    assert "GPU 0 busy 10%" in watch.progress_line(rows, 12.4, 60, 0)
    alone: list[dict[str, float | None]] = [{"t_mono": 0.0, "cpu_pct": 5.0}]
    assert "no GPU sampled" in watch.progress_line(alone, 1, 60)


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_live_line_on_a_log_writes_a_whole_line_every_ten_seconds() -> None:
    now = [100.0]
    stream = _Stream(tty=False)
    live = LiveLine(stream, every_s=10.0, clock=lambda: now[0])
    for second in range(1, 26):  # watch hands it a line a second
        now[0] = 100.0 + second
        live(f"watch: {second} of 60 s")
    live.close()
    assert stream.getvalue() == "watch: 10 of 60 s\nwatch: 20 of 60 s\n"


def test_live_line_on_a_terminal_rewrites_one_line_and_clears_it_at_the_end() -> None:
    stream = _Stream(tty=True)
    live = LiveLine(stream, every_s=10.0, clock=lambda: 0.0)
    live("watch: 1 of 60 s")
    live("watch: 2 of 60 s")
    live.close()
    assert stream.getvalue() == "\rwatch: 1 of 60 s\x1b[K\rwatch: 2 of 60 s\x1b[K\r\x1b[K"
