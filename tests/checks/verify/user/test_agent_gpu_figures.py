"""The agent's GPU figures without a GPU: the kernel summary of one profiled step over profiler events shaped as
``torch.profiler``'s (``kineto_results.events()`` items), the CUDA path of ``_Steps`` (profile one warm-up step,
the allocator's figures at a step's end and at exit) against a fake ``torch.cuda``, and a real CPU run that asks
for the profile and gets nothing, with no CUDA or profiler call made.

What none of this shows: that a real CUDA torch and CUPTI behave as the fakes do (the event objects, the
profiler's synchronize, ``memory_stats``' keys on a live allocator). ``test_a_cuda_run_writes_its_kernels_and_memory``
is that check, run only where CUDA is (``-m gpu``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from checks.config import make_config
from checks.verify.diagnosis import Signals, diagnose
from checks.verify.events import AgentError, KernelsLine, MemoryLine, StepLine, parse
from checks.verify.figures import union_length
from checks.verify.user import judge as j
from checks.verify.user.launch import StopRule, run_command

agent = importlib.import_module("checks.verify.user.inject._gpu_preflight_agent")
SCRIPTS = Path(__file__).resolve().parent / "scripts"
CFG = make_config().verify
CPU, CUDA = "DeviceType.CPU", "DeviceType.CUDA"  # what ``device_type()`` returns, compared with the given one
SHARES = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.4, "backward": 0.5, "optimizer": 0.1, "checkpoint": 0.0}


class Event:
    """One item of ``prof.profiler.kineto_results.events()``: the methods the agent reads."""

    def __init__(self, name: str, device: str, start_ns: int, end_ns: int) -> None:
        self._name, self._device, self._start, self._end = name, device, start_ns, end_ns

    def name(self) -> str:
        return self._name

    def device_type(self) -> str:
        return self._device

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end


def tiny_kernels(n: int, every_ns: int, length_ns: int, start: int = 0) -> list[Event]:
    """``n`` kernels of ``length_ns`` launched every ``every_ns``: the GPU idles between them (launch-bound)."""
    return [Event("void at::native::elementwise_kernel", CUDA, start + k * every_ns, start + k * every_ns + length_ns)
            for k in range(n)]  # fmt: skip


def summary(events: list[Event], compute_s: float) -> dict[str, Any]:
    return agent.kernel_summary(agent.kernel_intervals(events, CUDA), compute_s)


def test_the_kernels_of_a_launch_bound_step_give_the_launch_bound_verdict() -> None:
    """2,000 kernels of 4 µs, one every 14 µs, in a 28 ms compute window: 28% busy, all short (the H100 trace's
    figures); the host's own events and the copies are not kernels."""
    events = tiny_kernels(2000, 14_000, 4_000)
    events += [Event("aten::add", CPU, 0, 28_000_000), Event("Memcpy HtoD (Pageable -> Device)", CUDA, 0, 5_000_000)]
    events += [Event("Memset (Device)", CUDA, 0, 1_000_000)]
    k = summary(events, 0.028)
    assert k["kernels_per_step"] == 2000 and k["steps"] == 1
    assert k["median_kernel_us"] == 4.0 and k["short_kernel_time_share"] == 1.0
    assert k["busy_fraction"] == pytest.approx(8e-3 / 0.028)
    (v, *_) = diagnose(Signals(30, "cuda", SHARES, 0.03, kernels=k), CFG)
    assert v.id == "launch-bound" and "2000 kernels per step, median 4.0 µs" in v.summary


def test_kernels_on_two_streams_count_their_overlap_once() -> None:
    """A long kernel on one stream while short ones run on another: the busy time is their union (as the
    built-in loop's ``union_length``), so a busy GPU is not launch-bound."""
    long = [Event("ampere_sgemm_128x64_tn", CUDA, 0, 9_000_000)]
    short = tiny_kernels(100, 20_000, 5_000, start=1_000_000)  # inside the long one
    tail = [Event("volta_sgemm", CUDA, 9_500_000, 10_000_000)]
    intervals = agent.kernel_intervals(long + short + tail, CUDA)
    assert agent._union_ns(intervals) == union_length(intervals) == 9_500_000
    k = summary(long + short + tail, 0.010)
    assert k["busy_fraction"] == pytest.approx(0.95) and k["median_kernel_us"] == 5.0
    assert k["short_kernel_time_share"] == pytest.approx(500_000 / 10_000_000)
    assert diagnose(Signals(30, "cuda", SHARES, 0.01, kernels=k), CFG)[0].id == "compute-bound"
    assert summary(long, 0.005)["busy_fraction"] == 1.0  # never above the window (clocks apart by a little)


def test_a_profile_without_kernels_abstains() -> None:
    """CUPTI unavailable (a container without the profiling capability): no kernels recorded is no figure, never
    "0% busy", and the rule abstains."""
    k = summary([Event("aten::mm", CPU, 0, 10)], 0.02)
    assert k["busy_fraction"] is None and k["median_kernel_us"] is None and k["note"]
    assert diagnose(Signals(30, "cuda", SHARES, 0.03, kernels=k), CFG)[0].id == "compute-bound"
    assert summary(tiny_kernels(3, 10, 5), 0.0)["busy_fraction"] is None  # no compute window timed


class FakeCuda:
    """``torch.cuda`` as the agent calls it: CUDA events on a clock the test moves, the allocator's statistics,
    the device's memory; every call logged."""

    def __init__(self, initialised: bool = True) -> None:
        self.now_ms = 0.0
        self.calls: list[str] = []
        self.initialised = initialised
        self.stats: dict[str, int] = {
            "allocated_bytes.all.current": 6 << 30, "reserved_bytes.all.current": 8 << 30,
            "allocated_bytes.all.peak": 7 << 30, "reserved_bytes.all.peak": 8 << 30,
            "inactive_split_bytes.all.current": 1 << 20, "num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 9,
        }  # fmt: skip
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = fake.now_ms

            def query(self) -> bool:
                return True

            def elapsed_time(self, other: Any) -> float:
                return float(other.at - self.at)

        self.Event = Event

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"torch.cuda.{name} is not faked")

    def log(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialised:
            raise AssertionError(f"torch.cuda.{name} called where the script never initialised CUDA")

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialised

    def current_device(self) -> int:
        self.log("current_device")
        return 0

    def get_device_properties(self, index: int) -> Any:
        self.log("get_device_properties")
        return SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid="1234", total_memory=80 << 30)

    def memory_stats(self) -> dict[str, int]:
        self.log("memory_stats")
        return dict(self.stats)

    def mem_get_info(self) -> tuple[int, int]:
        self.log("mem_get_info")
        return (70 << 30, 80 << 30)

    def synchronize(self) -> None:
        self.log("synchronize")


class FakeProfile:
    """``torch.profiler.profile``: started and stopped once; its events the kernels of the profiled step."""

    made: ClassVar[list[FakeProfile]] = []
    kernels: ClassVar[list[Event]] = []

    def __init__(self, activities: list[str]) -> None:
        self.activities, self.started, self.stopped = activities, False, False
        self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: self.kernels))
        FakeProfile.made.append(self)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


def fake_torch(cuda: FakeCuda) -> Any:
    profiler = SimpleNamespace(profile=FakeProfile, ProfilerActivity=SimpleNamespace(CUDA="CUDA"))
    autograd = SimpleNamespace(
        DeviceType=SimpleNamespace(CUDA=CUDA), profiler=SimpleNamespace(_is_profiler_enabled=False)
    )
    return SimpleNamespace(
        cuda=cuda, profiler=profiler, autograd=autograd, get_float32_matmul_precision=lambda: "highest"
    )


def train(st: Any, cuda: FakeCuda, steps: int, on_step: Any = lambda i: None) -> None:
    """``steps`` optimizer steps of 10 ms on the GPU: 4 ms forward, 5 ms backward, 1 ms optimizer."""
    for i in range(1, steps + 1):
        cuda.now_ms += 4.0
        st.enter("backward")
        cuda.now_ms += 5.0
        st.leave("backward")
        st.begin_step()
        cuda.now_ms += 1.0
        st.end_step()
        on_step(i)


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []

    def say(event: str, **data: Any) -> None:
        line = {"event": event, **data}
        parse({"t": 0.0, "pid": 1, **line}, strict=True)  # every line the agent writes has its record, field by field
        lines.append(line)

    monkeypatch.setattr(agent, "_say", say)
    FakeProfile.made = []
    return lines


def test_the_cuda_path_profiles_the_asked_warm_up_step_and_reads_the_allocator(
    said: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for step 3: the profiler starts as step 2 ends (its start-up in step 2) and stops as step 3 ends;
    one kernels line follows step 3's line, its compute window step 3's forward + backward + optimizer (10 ms).
    The allocator's figures are read at a step's end (each step here: the interval set to 0) and written when
    they changed; at exit, its counters then with the current figures of the last step's end."""
    monkeypatch.setenv(agent.PROFILE_ENV, "3")
    monkeypatch.setattr(agent, "MEMORY_EVERY_S", 0.0)
    FakeProfile.kernels = tiny_kernels(500, 6_000, 4_000)  # 2 ms of kernels in the 10 ms window
    cuda = FakeCuda()
    st = agent._Steps(fake_torch(cuda))
    started_at: list[int] = []

    def grow(i: int) -> None:
        started_at.extend(i for p in FakeProfile.made if p.started and not started_at)
        if i == 3:  # the peak grows in step 4: a new memory line at its end; steps 2, 3 and 5 read no change
            cuda.stats["reserved_bytes.all.peak"] = 20 << 30
            cuda.stats["reserved_bytes.all.current"] = 20 << 30

    train(st, cuda, 5, grow)
    st.flush(True)
    cuda.stats |= {"allocated_bytes.all.current": 1 << 20, "num_ooms": 1}  # at exit: tensors gone, one OOM caught
    st.memory_at_exit()

    (profile,) = FakeProfile.made
    assert started_at == [2] and profile.stopped and profile.activities == ["CUDA"]
    events = [line["event"] for line in said]
    assert events.count("kernels") == 1 and events.index("kernels") == _index(said, "step", i=3) + 1
    (k,) = [line for line in said if line["event"] == "kernels"]
    assert k["step"] == 3 and k["kernels_per_step"] == 500 and k["median_kernel_us"] == 4.0
    assert k["busy_fraction"] == pytest.approx(0.2)
    memory = [line for line in said if line["event"] == "memory"]
    assert [(m["step"], m["at"]) for m in memory] == [(1, "step"), (4, "step"), (5, "exit")]
    assert memory[0]["total_bytes"] == 80 << 30 and memory[0]["peak_reserved_bytes"] == 8 << 30
    last = memory[-1]
    assert last["peak_reserved_bytes"] == 20 << 30 and last["num_ooms"] == 1  # the counters at exit
    assert last["allocated_bytes"] == 6 << 30 and last["reserved_bytes"] == 20 << 30  # the last step's end
    assert not [line for line in said if line["event"] == "agent-error"]
    # What the judge makes of these lines: the child's memory and kernels.
    lines = [e for line in said if (e := parse({"t": 0.0, **line, "pid": 10, "rank": None}, strict=True))]
    (r,) = j.ranks(lines, 2, 3, 0)
    assert r.kernels is not None and r.kernels.busy_fraction == pytest.approx(0.2)
    assert r.memory is not None and r.memory.num_ooms == 1 and "at" not in r.memory.figures()


def _index(lines: list[dict[str, Any]], event: str, **match: Any) -> int:
    return next(n for n, line in enumerate(lines) if line["event"] == event and line.items() >= match.items())


def test_without_a_profile_step_nothing_is_profiled_and_memory_is_read_once_a_second(
    said: list[dict[str, Any]],
) -> None:
    cuda = FakeCuda()
    st = agent._Steps(fake_torch(cuda))
    train(st, cuda, 6)
    st.flush(True)
    assert FakeProfile.made == [] and not [line for line in said if line["event"] == "kernels"]
    assert cuda.calls.count("memory_stats") == 1  # six steps well within a second: read at the first one only


def test_the_per_step_peaks_of_the_sweep_are_the_memory_lines_peak(
    said: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With GPU_PREFLIGHT_PEAK (the sweep's re-runs) the peak is reset every step: the memory line's peak is the
    largest of the steps' peaks, not the last step's."""
    monkeypatch.setenv(agent.PEAK_ENV, "1")
    cuda = FakeCuda()
    cuda.reset_peak_memory_stats = lambda: cuda.stats.update({"reserved_bytes.all.peak": 1 << 30})  # type: ignore[attr-defined]
    st = agent._Steps(fake_torch(cuda))
    train(st, cuda, 1)
    cuda.stats["reserved_bytes.all.peak"] = 30 << 30  # step 2's peak
    train(st, cuda, 1)
    st.flush(True)
    st.memory_at_exit()
    steps = [line for line in said if line["event"] == "step"]
    assert [s["peak_bytes"] for s in steps] == [8 << 30, 30 << 30]
    assert [m for m in said if m["event"] == "memory"][-1]["peak_reserved_bytes"] == 30 << 30


def test_a_script_that_never_initialises_cuda_gets_no_cuda_call(said: list[dict[str, Any]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A GPU box, a script training on the CPU: asked for a profile, the agent makes no CUDA call and writes no
    memory or kernels line (FakeCuda fails any call while CUDA is not initialised)."""
    monkeypatch.setenv(agent.PROFILE_ENV, "2")
    cuda = FakeCuda(initialised=False)
    st = agent._Steps(fake_torch(cuda))
    train(st, cuda, 4)
    st.flush(True)
    st.memory_at_exit()
    assert cuda.calls == [] and FakeProfile.made == []
    assert {line["event"] for line in said} == {"device", "step"}


@pytest.mark.slow
def test_a_cpu_run_asked_for_the_profile_writes_nothing_and_calls_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real agent in a real CPU run (warm-up 3: the profile asked for step 2): no memory or kernels line, no
    agent error, and none of torch's allocator or profiler functions called (the script records any call)."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CUDA_SPY_FILE", str(calls))
    started = time.monotonic()
    run = run_command([sys.executable, "cuda_spy.py"], StopRule(3, 3, first_step_s=120), str(SCRIPTS), None,
                      subprocess.DEVNULL)  # fmt: skip
    assert time.monotonic() - started < 120
    assert (tmp_path / "calls.txt.asked").read_text() == "2"  # the launcher asked the agent for step 2
    assert not calls.exists(), calls.read_text()
    kinds = {type(e) for e in run.events}
    assert StepLine in kinds and not kinds & {MemoryLine, KernelsLine, AgentError}, kinds
    (r,) = j.ranks(run.events, 3, 3, 0)
    child = j._child_result(r, j.rank_figures(r))
    assert child.memory is None and child.kernels is None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA torch and an NVIDIA GPU")
def test_a_cuda_run_writes_its_kernels_and_memory() -> None:  # pragma: no cover - run where CUDA is
    """On a GPU (``python -m pytest -m gpu`` this file): the measured run's warm-up step 2 profiled, the allocator's
    figures read; the judge hands them to the rules."""
    import torch

    run = run_command([sys.executable, "cuda_spy.py", "--cuda"], StopRule(3, 5, first_step_s=300), str(SCRIPTS),
                      None, subprocess.DEVNULL)  # fmt: skip
    assert not [e for e in run.events if isinstance(e, AgentError)], run.events
    (r,) = j.ranks(run.events, 3, 5, 0)
    k = r.kernels
    assert k is not None and k.step == 2 and (k.kernels_per_step or 0) > 10, k
    assert 0 < (k.busy_fraction or 0) <= 1 and (k.median_kernel_us or 0) > 0
    assert r.memory is not None and r.memory.total_bytes == torch.cuda.mem_get_info()[1]
    assert 0 < r.memory.allocated_bytes <= r.memory.peak_allocated_bytes <= r.memory.peak_reserved_bytes
