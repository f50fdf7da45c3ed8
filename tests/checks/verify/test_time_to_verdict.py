"""Time to verdict: the whole command's budget and the stop rule of ``checks/verify/stop.py``.

Real CPU training: a planted slow-step model (a forward pass that sleeps, so its step time holds on a busy box)
through the CLI as a user runs it, ``invoke verify`` below the CLI, and ``verify -- COMMAND`` on a user's script.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig
from checks.verify import stop as rule
from checks.verify.contract import StopSpec
from checks.verify.user import launch
from checks.verify.user.launch import STALL_FLOOR_S, StopRule
from checks.verify.user.run import estimate
from tests.checks.verify.user.test_command import SCRIPTS
from tests.checks.verify.user.test_command import verify as verify_command
from tests.fakes.builtin import PLUGINS, builtin, config
from tests.fakes.cli import invoke
from tests.fakes.verdicts import planted_row

# --- the rule alone -----------------------------------------------------------------------------------------


def test_half_widths_come_from_batch_means_of_the_shares() -> None:
    steady = [[0.5, 0.0, 0.3, 0.15, 0.05]] * 10
    assert rule.half_widths(steady, 5) == dict.fromkeys(("data_wait", "h2d", "forward", "backward", "optimizer"), 0)
    assert rule.stable(steady, 10, 0.05, 5) and not rule.stable(steady, 11, 0.05, 5)  # the minimum count
    # Batches of two steps whose data wait alternates 0.1 / 0.9 of the step: every batch is 0.5, the spread is
    # within the batches, not between them (what batch means are for).
    alternating = [[0.1, 0, 0.9, 0, 0], [0.9, 0, 0.1, 0, 0]] * 5
    assert rule.half_widths(alternating, 5)["data_wait"] == 0  # type: ignore[index]
    # One slow batch of data wait among steady ones: t(4) * sd / sqrt(5) = 2.776 * 0.179 / 2.236 = 0.222.
    drifting = [[0.1, 0, 0.9, 0, 0]] * 8 + [[0.5, 0, 0.5, 0, 0]] * 2
    assert rule.half_widths(drifting, 5)["data_wait"] == pytest.approx(0.2222, abs=1e-3)  # type: ignore[index]
    assert not rule.stable(drifting, 10, 0.05, 5)
    assert rule.half_widths(steady[:4], 5) is None  # fewer steps than batches: cannot tell


def test_counts_fit_the_seconds_at_the_pace_but_never_below_the_floor() -> None:
    assert rule.counts(30, 20, 1.0, 25.0) == (20, 25)
    assert rule.counts(30, 20, 1.0, 3.0) == (rule.MIN_UNDER_PRESSURE, rule.MIN_UNDER_PRESSURE)  # a slow box
    assert rule.counts(30, 20, 0.01, float("inf")) == (20, 30)
    assert rule.more_budget(120, 3) == 130 and rule.more_budget(120, 0) == 130


# --- the flag and the key -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-5", "abc", "nan"])
def test_a_budget_of_zero_negative_or_not_a_number_exits_2(tmp_path: Path, value: str) -> None:
    run = invoke(tmp_path, "verify", "--budget", value, "--json", str(tmp_path / "r.json"))
    assert run.code == 2, run.why()
    assert run.err.strip().splitlines() == [
        f"gpu-preflight: verify: --budget must be a number of seconds above 0, got {value} (the wall time for the"
        " whole verify, e.g. --budget 300; --steps N measures exactly N steps)"
    ], run.why()
    assert not (tmp_path / "r.json").exists()


def test_a_configured_budget_of_zero_exits_2(tmp_path: Path) -> None:
    run = invoke(tmp_path, "verify", env={"INVOKE_PREFLIGHT_VERIFY_BUDGET": "0"})
    assert run.code == 2 and "preflight.verify.budget must be a number of seconds above 0, got 0.0" in run.err


# --- the tool's script (invoke verify without --) ----------------------------------------------------------------------------------------


def below_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: PreflightConfig, budget: float, **options: Any
) -> dict[str, Any]:
    """``invoke verify`` (the tool's script as a command) below the CLI with ``budget`` seconds: the measurements."""
    _, _, m = builtin(tmp_path, monkeypatch, cfg, budget=str(budget), **options)
    assert m.get("time_to_verdict"), m
    return m


@pytest.mark.slow
def test_steps_n_is_measured_whatever_the_budget_and_without_it_the_budget_cuts_to_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget spent before the first step: --steps 12 still measures 12; without --steps the floor under
    pressure (3), a named cut. Steps of 50 ms (a forward pass that sleeps): verify reads the script's steps about
    every 0.1 s, and a script faster than that makes its 12 steps before the rule can stop it at 3."""
    monkeypatch.setenv("SMOKE_STEP_S", "0.05")
    cfg = config(steps=12)
    kw = {"dataset": f"{PLUGINS}:patterned", "model": f"{PLUGINS}:slow_model", "workers": 0}
    m = below_cli(tmp_path, monkeypatch, cfg, 1.0, steps=12, **kw)
    forced = m["time_to_verdict"]
    assert forced["stop"]["reason"] == "forced" and m["step_time"]["steps"] == 12
    # what the spent budget leaves out is named (the resume replay), never the measured steps
    assert "measure" not in [c["part"] for c in forced["cuts"]], forced["cuts"]
    m = below_cli(tmp_path, monkeypatch, cfg, 1.0, **kw)
    cut = m["time_to_verdict"]
    # the floor under pressure, and fewer than asked: a step or two more where a crowded box delayed verify's read
    # of the script's steps (50 ms each; more beside a CPU hog per core, where the stop's signal comes later too)
    steps = m["step_time"]["steps"]
    assert cut["stop"]["reason"] == "budget" and rule.MIN_UNDER_PRESSURE <= steps < 12, cut
    measure = next(c for c in cut["cuts"] if c["part"] == "measure")
    assert measure["summary"].startswith(f"{steps} of at most 12 steps measured at"), measure
    assert measure["fix"].startswith("--budget ") and measure["fix"].endswith(" or --steps 12")


@pytest.mark.slow
@pytest.mark.measures
def test_stable_shares_stop_the_measured_steps_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose forward pass sleeps 50 ms: its shares are steady (a busy box's jitter is a few ms of it), so
    far fewer measured steps than the 200 allowed are enough (10 on a quiet box), and every share is known to
    within the width."""
    monkeypatch.setenv("SMOKE_STEP_S", "0.05")
    cfg = config(steps=200, critical_min_steps=10)
    m = below_cli(
        tmp_path, monkeypatch, cfg, 300.0, dataset=f"{PLUGINS}:patterned", model=f"{PLUGINS}:slow_model", workers=0
    )
    stop = m["time_to_verdict"]["stop"]
    assert stop["reason"] == "stable", stop
    assert 10 <= stop["measured"] < 100 and m["step_time"]["steps"] == stop["measured"]
    # the rule judged the steps it had read; the report's widths hold every measured step, those read after too
    assert max(stop["half_width"].values()) <= 1.5 * cfg.verify.stable_width, stop
    assert m["time_to_verdict"]["cuts"] == [] and m["step_breakdown"]["forward"] > 0.5


@pytest.mark.slow
def test_a_slow_step_model_gets_its_verdict_within_the_budget_and_names_the_cut(tmp_path: Path) -> None:
    """As a user runs it: 0.5 s steps, up to 30 measured after a warm-up of 8, a 25 s budget for the whole command
    (the gate's torch probe, the script's start, the warm-up, the resume replay and the report included). The
    stop rule cannot end it first (critical_min_steps 60), so the budget does: fewer steps, said so with the flag
    that gets them all; the resume replay still runs (one short start of the script), and the model-side re-runs
    that cannot fit what is left are skipped at once, not started.

    Not ``measures``: its steps sleep, so it needs the box's time, not its cores, and it shares them with the other
    tests. 18-21 s wall on the 2-core box under other tests' load."""
    env = {
        "INVOKE_PREFLIGHT_VERIFY_STEPS": "30",
        "INVOKE_PREFLIGHT_VERIFY_WARMUP": "8",
        "INVOKE_PREFLIGHT_VERIFY_CRITICAL_MIN_STEPS": "60",
        "INVOKE_PREFLIGHT_VERIFY_BATCH_SIZE_CPU": "16",
        "INVOKE_PREFLIGHT_VERIFY_REPORT_DIR": str(tmp_path / "reports"),
        "SMOKE_STEP_S": "0.5",
    }
    args = ("--dataset", f"{PLUGINS}:patterned", "--model", f"{PLUGINS}:slow_model", "--workers", "0")
    started = time.monotonic()
    done = invoke(tmp_path, "verify", "--budget", "25", *args, "--json", str(tmp_path / "r.json"), env=env)
    wall = time.monotonic() - started
    assert done.code == 0, done.why()
    report = json.loads((tmp_path / "r.json").read_text())
    timed = report["measurements"]["time_to_verdict"]
    row = next(r for r in report["results"] if r["id"] == "verify-time")
    if timed["within_budget"]:
        assert timed["seconds"] <= 25, timed
    else:  # the fewest steps a verdict needs outlasted the budget (25.7 s at load 6: the suite beside a hog per core)
        assert "(over: the fewest steps a verdict needs took longer)" in row["summary"], row
        assert timed["stop"]["measured"] == rule.MIN_UNDER_PRESSURE, timed
    # The interpreter's own start and exit are outside verify's clock: under 5 s on a quiet box, 5.25 s with a CPU hog
    # per core beside the suite (30.25 s wall).
    assert wall <= 25 + 10, wall
    assert timed["stop"]["reason"] == "budget" and rule.MIN_UNDER_PRESSURE <= timed["stop"]["measured"] < 30
    measure = timed["cuts"][0]
    assert measure["part"] == "measure" and measure["fix"].endswith("or --steps 30"), timed["cuts"]
    loop = next(r for r in report["results"] if r["id"] == "verify-loop")["summary"]
    assert " warm-up excluded)" in loop and "(1 warm-up excluded)" not in loop, loop  # under pressure: fewer
    assert row["summary"].startswith("verdict in ") and "of the 25 s budget" in row["summary"]
    assert "or --steps 30 gets it all)" in row["summary"] and "--budget " in row["summary"]
    # 0.5 s a step, more when crowded: the estimate follows the warm-up's last step as verify reads it. With a CPU
    # hog per core beside the suite, the budget once ran out before verify had read any step line (none shown as the
    # run went), so the estimate is asserted where step 8 was shown.
    if "verify: step 8 (warm-up)" in done.err:
        assert "verify: warm-up done, " in done.err and "25 s budget" in done.err, done.err
    ckpt = next(r for r in report["results"] if r["id"] == "verify-checkpoint")
    # replayed, or (a loaded box whose budget ended the run at the first save) said why not
    assert ckpt["status"] == "ok" and (
        "reproduces the next" in ckpt["summary"] or "no resume replayed" in ckpt["summary"]
    )
    verdicts = [v["id"] for v in report["measurements"]["diagnosis"]["verdicts"]]
    assert "compute-bound" in verdicts, verdicts  # first, or after cpu-contended on a loaded box
    model = report["measurements"].get("model_advice") or {}
    assert all("mean_step_s" not in c for c in model.get("candidates", [])), model  # none started past the budget


# --- verify -- COMMAND -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_command_with_steady_steps_is_stopped_once_its_shares_are_stable(tmp_path: Path) -> None:
    """slow_steps.py sleeps 0.2 s a step, forever: stopped by the stop rule after 10 measured steps, not 200."""
    judged = verify_command(
        tmp_path, sys.executable, str(SCRIPTS / "slow_steps.py"), str(tmp_path / "marker"), steps=0,
        verify_cfg={"steps": 200, "critical_min_steps": 10},
    )  # fmt: skip
    timed = judged.report.measurements["time_to_verdict"]
    assert timed["stop"]["reason"] == "stable", timed
    assert 10 <= timed["stop"]["measured"] < 40 and timed["cuts"] == []
    assert judged.report.measurements["command"]["ended"] == "stopped"
    row = next(r for r in judged.report.results if r.id == "verify-time")
    assert "every share within" in row.summary and "stopped at" in row.summary


@pytest.mark.slow
def test_a_command_too_slow_for_the_budget_is_judged_within_it_on_the_steps_it_made(tmp_path: Path) -> None:
    """1.5 s steps, a warm-up of 5, a 14 s budget: the warm-up alone leaves about one measured step before the
    budget ends. verify stops the command at the budget (not after the 8 steps a settled verdict wants, which
    would have taken 20 s more), judges the warm-up's steps after the first too, and says so: the cut, the low
    confidence, and the estimate line that does not promise what the budget cannot hold."""
    said: list[str] = []
    started = time.monotonic()
    judged = verify_command(
        tmp_path, sys.executable, str(SCRIPTS / "paced_steps.py"), "--step-s", "1.5", steps=0, warmup=5,
        budget="14", said=said, verify_cfg={"steps": 30},
    )  # fmt: skip
    wall = time.monotonic() - started
    timed = judged.report.measurements["time_to_verdict"]
    assert timed["stop"]["reason"] == "budget", timed
    # steps 4-6 or later: three, the warm-up's among them; fewer where a crowded box slowed the start (the budget
    # still ends it: the wall bound below)
    assert 1 <= timed["stop"]["measured"] <= rule.MIN_UNDER_PRESSURE, timed
    assert wall <= 14 + 1.5 + rule.TAIL_S, wall  # the budget, one step, and the judging after it
    cuts = {c["part"]: c["summary"] for c in timed["cuts"]}
    measured = timed["stop"]["measured"]
    assert "are judged, the warm-up's among them" in cuts["warmup"]
    assert cuts["measure"].startswith(f"{measured} of at most 30"), cuts
    row = next(r for r in judged.report.results if r.id == "verify-time")
    assert "low confidence" in row.summary
    assert planted_row(judged.report.measurements)["confidence"] == "low"
    assert not any("within the 14 s budget" in line for line in said), said


def test_the_estimate_after_the_warm_up_never_promises_what_the_budget_cannot_hold() -> None:
    """The estimate line with 2 s left at 1.5 s a step: no "about 12-45 s more ... within the budget"."""
    spec = StopSpec(20, 0.05, 5, 14.0, time.monotonic() + 2.0)
    line = estimate(StopRule(5, 30, stop=spec), 1.5)
    assert line.startswith("verify: warm-up done, 1.50 s a step: 2 s of the 14 s budget left for measured steps, 1 ")
    assert "within the" not in line and "low confidence" in line
    roomy = estimate(StopRule(5, 30, stop=StopSpec(20, 0.05, 5, 120.0, time.monotonic() + 100.0)), 1.5)
    assert roomy.endswith("within the 120 s budget") and "about 30-45 s more (20 to 30 measured steps" in roomy


@pytest.mark.slow
def test_steps_that_stop_coming_after_the_budget_are_a_stall_in_seconds_not_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step (start-up), then the script waits forever: with verify.stall_timeout_s 300, the stall is called
    once the budget is spent and the floor (STALL_FLOOR_S, 15 s; 3 s here to keep the suite short) has passed
    without a step."""
    monkeypatch.setattr(launch, "STALL_FLOOR_S", 3.0)
    started = time.monotonic()
    judged = verify_command(
        tmp_path, sys.executable, str(SCRIPTS / "paced_steps.py"), "--step-s", "0.1", "--stop-after", "1", steps=0,
        budget="8", verify_cfg={"stall_timeout_s": 300.0},
    )  # fmt: skip
    wall = time.monotonic() - started
    assert judged.report.measurements["command"]["ended"] == "stalled"
    assert wall < 8 + 3.0 + 10, wall  # not the 300 s of verify.stall_timeout_s
    assert STALL_FLOOR_S == 15.0
    row = next(r for r in judged.report.results if r.id == "verify-command")
    assert "steps stopped after 1" in row.summary


@pytest.mark.slow
def test_a_long_step_is_said_to_be_running_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2.5 s steps with the launcher's tick every second (15 s in the product): between step lines the terminal
    hears which step is running and for how long, not silence."""
    monkeypatch.setattr(launch, "PROGRESS_EVERY_S", 1.0)
    said: list[str] = []
    verify_command(
        tmp_path, sys.executable, str(SCRIPTS / "paced_steps.py"), "--step-s", "2.5", steps=2, warmup=1, said=said
    )
    running = [line for line in said if " running for " in line]
    assert running and all(line.startswith("verify: step ") and line.endswith(" s") for line in running), said
    assert any(line.startswith("verify: step 2 running for ") for line in said), said
