"""bootstrap's own time: the phases a live run records, what a replay records, and the report's one line."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from checks import probe as probe_mod
from checks.facts import EnvFacts, HostFacts, NvmlFacts, TopologyFacts, TorchFacts
from checks.machine.bootstrap import BootstrapRequest, bootstrap
from checks.probe import LocalProbe
from checks.render import render_text, timing_line
from checks.result import Phase, Report, Timing
from tests.factories import config

FIXTURE = Path(__file__).parents[2] / "fixtures" / "machines" / "rtx4090-power-capped.json"
LINE = re.compile(r"^bootstrap took (\d+\.\d) s: (.*)$")
TERM = re.compile(r"(?:^|, )([a-zA-Z0-9 -]+?) (\d+\.\d)(?: \(([^)]*) alongside\))?")


def terms(line: str) -> tuple[float, dict[str, float]]:
    """The total of a timing line and its top-level terms (the bracketed ones ran beside them)."""
    m = LINE.match(line)
    assert m, line
    top = re.sub(r" \([^)]*\)", "", m.group(2))
    return float(m.group(1)), {name: float(sec) for name, sec in (t.rsplit(" ", 1) for t in top.split(", "))}


def test_the_line_names_overlapping_phases_once_and_its_terms_add_up_to_the_total() -> None:
    timing = Timing(
        5.31,
        (
            Phase("NVML", 0.0, 0.004),
            Phase("torch probe", 0.01, 1.71),
            Phase("host", 0.011, 0.003),
            Phase("environment", 0.014, 0.21),
            Phase("disks", 1.73, 3.12),
            Phase("checks", 4.86, 0.02),
        ),
    )
    line = timing_line(timing)
    assert line == "bootstrap took 5.3 s: torch probe 1.7 (environment 0.2 alongside), disks 3.1, other 0.5"
    total, parts = terms(line)
    assert sum(parts.values()) == pytest.approx(total, abs=0.05 * (len(parts) + 1) + 1e-9)  # each term rounded


@pytest.mark.parametrize(
    "phases",
    [
        (),  # nothing timed: everything is "other"
        (Phase("torch probe", 0.0, 2.449), Phase("disks", 2.45, 2.449), Phase("allocator", 4.9, 2.449)),
        (Phase("a", 0.0, 1.0), Phase("b", 0.5, 1.0), Phase("c", 1.2, 0.3), Phase("d", 2.0, 0.01)),
    ],
)
def test_the_terms_add_up_within_their_rounding(phases: tuple[Phase, ...]) -> None:
    timing = Timing(7.4, phases)
    total, parts = terms(timing_line(timing))
    assert total == 7.4
    assert sum(parts.values()) == pytest.approx(total, abs=0.05 * (len(parts) + 1) + 1e-9)  # each term rounded


def test_a_replayed_snapshot_records_no_phases_and_prints_no_timing_line() -> None:
    report = bootstrap(BootstrapRequest(config(), machine=FIXTURE)).report
    assert report.timing is not None and report.timing.replayed and report.timing.phases == ()
    timing = report.to_json()["timing"]
    assert timing["replayed"] is True and timing["phases"] == [] and timing["seconds"] >= 0
    assert "bootstrap took" not in render_text(report)


def test_a_report_without_timing_keeps_the_old_keys_only() -> None:
    """verify, --hook and alloc-conf build reports without timing: their JSON is what it was."""
    doc = Report("h", "live", ()).to_json()
    assert set(doc) == {"schema", "tool", "host", "machine", "counts", "results", "measurements"}


def test_the_host_and_environment_are_read_while_the_torch_child_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    env_read = threading.Event()

    def torch_child(timeout: float = 60.0) -> TorchFacts:
        # The child ends only once the environment was read: read one after the other, this waits 10 s for nothing
        # and the facts say no torch.
        return TorchFacts(version="2.13.0+cpu" if env_read.wait(10) else None)

    def env(nvcc_timeout_s: float = 10.0) -> EnvFacts:
        time.sleep(0.2)  # a read that takes a while, for the stopwatch to record
        env_read.set()
        return EnvFacts()

    monkeypatch.setattr(probe_mod, "read_nvml", lambda: NvmlFacts(error="no NVML"))
    monkeypatch.setattr(probe_mod, "read_torch", torch_child)
    monkeypatch.setattr(probe_mod, "read_host", lambda: HostFacts(hostname="box"))
    monkeypatch.setattr(probe_mod, "read_env", env)
    monkeypatch.setattr(probe_mod, "read_box_topology", lambda: TopologyFacts())
    probe = LocalProbe()
    facts = probe.machine()
    assert facts.torch.version == "2.13.0+cpu" and facts.host.hostname == "box" and facts.env == EnvFacts()
    phases = {p.name: p for p in probe.clock.phases}
    assert list(phases) == ["NVML", "torch probe", "host", "environment", "topology"]  # the same order every run
    torch, env_phase = phases["torch probe"], phases["environment"]
    assert phases["NVML"].start_s + phases["NVML"].seconds <= torch.start_s  # NVML never sees the child
    assert env_phase.start_s < torch.start_s + torch.seconds  # read while the child ran
    assert env_phase.seconds >= 0.2  # a sleep is never shorter than asked
    # the child ended only after the environment's 0.2 s read (it started a moment after that read began, so its
    # own duration can be a little under 0.2 s: its end is what the wait fixes)
    assert torch.start_s + torch.seconds >= env_phase.start_s + 0.2


@pytest.mark.slow  # a real torch child and real disk measurements
def test_a_live_bootstrap_records_its_phases_in_the_json_and_one_line_that_adds_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = config(disk={"budget_s": 0.5, "max_locations": 1, "use_fio": False})
    report = bootstrap(BootstrapRequest(cfg)).report
    timing = report.to_json()["timing"]
    assert timing["replayed"] is False and timing["seconds"] > 0
    phases = {p["phase"]: p for p in timing["phases"]}
    assert {"NVML", "torch probe", "host", "environment", "topology", "disks", "checks"} <= set(phases)
    assert phases["torch probe"]["seconds"] > 0 and phases["disks"]["seconds"] > 0
    assert "torch-build" in phases["torch probe"]["checks"] and "disk-speed" in phases["disks"]["checks"]
    for p in timing["phases"]:
        assert p["seconds"] >= 0 and 0 <= p["start_s"] <= timing["seconds"], p
        assert p["start_s"] + p["seconds"] <= timing["seconds"] + 0.001, p
    line = next(line for line in render_text(report).splitlines() if line.startswith("bootstrap took"))
    total, parts = terms(line)
    assert total == pytest.approx(timing["seconds"], abs=0.05)
    assert sum(parts.values()) == pytest.approx(total, abs=0.05 * (len(parts) + 1) + 1e-9)  # each term rounded
    assert "torch probe" in parts and "disks" in parts
