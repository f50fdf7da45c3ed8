"""invoke verify --nproc 2: the tool's script under torchrun, DistributedDataParallel over gloo, two real processes on
this CPU machine, judged on the command path.

Below the CLI (``verify_builtin``, tests/fakes/planted.py) with models of ``planted_plugins`` that plant per rank:
many gradient bytes (the exchange), rank 1 slowed, crashing or hanging. As a user runs it (``python -m invoke``)
where the process is the point: Ctrl-C; in this process through the CLI for a refusal before anything starts.

None holds the box alone (``measures``): the exchange (32 MB a step over gloo), the straggler (40 ms a forward) and
the scaling's bounds are planted far past what a neighbour moves; the three passed three runs in a row with a CPU
hog per core beside them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.checks.verify.planted_plugins import SIDE, WIDE_FLOATS
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.fakes.cli import Here, assert_usage_error, by_id, child_env, default_sigint
from tests.fakes.planted import PLUGINS, REPO, Planted, builtin, config, machine
from tests.fakes.verdicts import planted_row

SHARE_WARN = config().verify.share_warn


def two_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, replay: bool = False, **verify: float
) -> Planted:
    """8 measured steps of ``model`` on the planted images, 2 ranks, no DataLoader workers; the resume replayed
    only where ``replay``."""
    return builtin(
        tmp_path, monkeypatch, config(**verify), steps=8, nproc=2, workers=0, dataset=f"{PLUGINS}:patterned",
        model=f"{PLUGINS}:{model}", replay=replay,
    )  # fmt: skip


def row(run: Planted, rid: str) -> tuple[str, str, str]:
    r = run.rows[rid]
    return r.status.value, r.summary, r.hint or ""


@pytest.mark.slow
def test_two_ranks_measure_the_exchange_and_judge_it_comm_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = two_ranks(tmp_path, monkeypatch, "wide_model", replay=True)
    assert "verify: 2 processes, DistributedDataParallel (gloo on the CPU) under torchrun" in run.said
    d = run.m["ddp"]
    assert (d["world_size"], d["backend"]) == (2, "gloo")
    assert d["grad_bytes"] == 4 * (SIDE * SIDE * 3 * 4 + 4 + WIDE_FLOATS)  # fp32: exactly what DDP reduces
    assert [r["rank"] for r in d["per_rank"]] == [0, 1]
    assert all(r["own_s"] > 0 and r["median_s"] > 0 for r in d["per_rank"])
    assert d["comm_exposed_ms"] > 0 and d["comm_share"] >= SHARE_WARN, d
    verdict = planted_row(run.m)
    assert verdict["id"] == "comm-bound", run.rows["diagnosis"].summary
    assert verdict["evidence"]["grad_bytes"] == d["grad_bytes"] and "32 MB all-reduced" in verdict["summary"]
    assert verdict["fix"].startswith("1) sync every"), verdict["fix"]  # the largest measured saving first
    # the checkpoint round trip under DDP: rank 0 saved, both ranks resumed from it, the same steps' loss
    status, summary, _ = row(run, "verify-checkpoint")
    assert status == "ok" and "reproduces the next 2 steps' loss exactly" in summary, summary
    status, summary, _ = row(run, "verify-data-resume")  # each rank's rebuilt loader drew its kept batches
    assert status == "ok" and "bit for bit" in summary, summary


@pytest.mark.slow
def test_two_ranks_report_their_scaling_against_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The solo leg (``checks/verify/user/solo.py``): the same torchrun command as one process, 2 + 8 steps; the
    scaling efficiency is the 2 ranks' samples/s over twice its. The exchange A/B is left out here (test_exchange.py
    times it), so the re-runs' seconds go to the solo leg."""
    from checks.verify.user import run as command_run

    monkeypatch.setattr(command_run, "_exchange", lambda *args, **kwargs: None)
    run = two_ranks(tmp_path, monkeypatch, "wide_model", command_advice_s=60.0)
    assert any(line.startswith("verify: timing the command as one process") for line in run.said), run.said
    d = run.m["ddp"]
    assert (d["samples_per_s_one"] or 0) > 0, d.get("scaling_note")
    assert d["samples_per_s"] == pytest.approx(run.m["samples_per_s"], rel=1e-3)
    assert 0 < d["scaling_efficiency"] < 1.5, d  # two ranks on 2 shared cores: below 1, never far above
    assert d["scaling_efficiency"] == pytest.approx(d["samples_per_s"] / (2 * d["samples_per_s_one"]), rel=1e-2)
    assert "scaling_note" not in d
    status, summary, _ = row(run, "verify-ddp")
    assert status == "ok" and f"scaling efficiency {100 * d['scaling_efficiency']:.0f}%" in summary, summary


@pytest.fixture(scope="module")
def straggling(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    """Rank 1 spends 40 ms more on every forward. Its report is checked against the schema by the test below."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return two_ranks(tmp_path_factory.mktemp("straggler"), monkeypatch, "straggler_model")


@pytest.mark.slow
def test_a_slow_rank_is_named_as_the_straggler(straggling: Planted) -> None:
    m = straggling.m
    ids = [v["id"] for v in m["diagnosis"]["verdicts"]]
    assert "straggler" in ids, m["diagnosis"]
    found = next(v for v in m["diagnosis"]["verdicts"] if v["id"] == "straggler")
    assert found["evidence"]["rank"] == 1 and found["summary"].startswith("rank 1 (CPU) takes "), found["summary"]
    assert found["evidence"]["gpu"] is None and "rank 1's cores" in found["fix"]
    rows = {r["rank"]: r for r in m["ddp"]["per_rank"]}
    assert rows[1]["own_s"] - rows[0]["own_s"] > 0.02  # the planted 40 ms, less scheduling noise
    assert m["ddp"]["judged_rank"] == 1  # the verdicts read the rank the others wait for


@pytest.mark.slow
def test_a_run_judged_on_a_rank_that_does_not_save_still_reports_the_save(straggling: Planted) -> None:
    doc = json.loads(json.dumps(straggling.judged.report.to_json(), default=str))
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
    assert straggling.m["checkpoint"]["save_s"] > 0


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    """Rank 1 raises on its 4th forward (its report is checked against the schema)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return two_ranks(tmp_path_factory.mktemp("crash"), monkeypatch, "crashing_model")


@pytest.mark.slow
def test_a_crashing_rank_stops_every_rank(crashed: Planted) -> None:
    command = crashed.m["command"]
    assert command["ended"] == "crashed" and command["ended_by_itself"], command
    assert command["processes_left"] == []  # and nothing the script started survives (the helper checks)
    assert command["seconds"] < 60  # stopped at once, not after the collective timeout
    status, summary, _ = row(crashed, "verify-command")
    assert status == "fail" and "crashed (exit status 1) after 3 optimizer step(s)" in summary, summary


@pytest.mark.slow
def test_a_crashing_rank_is_named_with_its_own_error(crashed: Planted) -> None:
    _, summary, hint = row(crashed, "verify-command")
    assert "rank 1" in summary and "RuntimeError: planted failure on rank 1" in summary, summary
    assert "planted failure on rank 1" in hint  # the rank's own last output


@pytest.mark.slow
def test_a_hanging_rank_stalls_out_and_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = two_ranks(tmp_path, monkeypatch, "hanging_model", stall_timeout_s=5.0)
    command = run.m["command"]
    assert command["ended"] == "stalled" and command["stopped_by_verify"], command
    assert command["processes_left"] == []  # every rank of the group is gone (and nothing else: the helper)
    status, summary, hint = row(run, "verify-command")
    assert status == "fail" and "steps stopped after 3" in summary and "hung collective" in hint, summary


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_writes_the_partial_report_and_exits_130(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = child_env(home) | {
        "INVOKE_PREFLIGHT_VERIFY_IMAGE_SIZE": "16",
        "INVOKE_PREFLIGHT_VERIFY_BATCH_SIZE_CPU": "16",
        "INVOKE_PREFLIGHT_VERIFY_WARMUP": "1",
        "INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S": "0",
    }
    argv = [sys.executable, "-m", "invoke", "verify", "--nproc", "2", "--steps", "400", "--workers", "0"]
    argv += ["--json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )  # a suite started as a background job has SIGINT ignored: the child must hear it as from a terminal
    seen, deadline, family = "", time.monotonic() + 120, set()
    assert proc.stderr is not None
    while "step 10 (measured)" not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.readline()
        family |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert "2 processes, DistributedDataParallel (gloo on the CPU) under torchrun" in seen, seen
    proc.send_signal(signal.SIGINT)  # what a terminal sends to the foreground process
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    report = json.loads((tmp_path / "r.json").read_text())
    m = report["measurements"]
    assert m["command"]["ended"] == "interrupted" and m["command"]["processes_left"] == [], m["command"]
    assert 9 <= m["step_time"]["steps"] < 400  # step 10, the warm-up one excluded
    assert by_id(report)["verify-loop"]["status"] in ("ok", "warn")  # the steps it measured are judged
    time.sleep(0.5)
    assert len(family) >= 3  # torchrun and both ranks were seen, and none is left
    assert not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_nproc_beyond_the_cores_exits_2_in_one_line(
    here: Here, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checks import probe

    monkeypatch.setattr(probe.LocalProbe, "machine", lambda self: machine())  # this box, without the torch probe
    home = tmp_path / "home"
    home.mkdir()
    run = here(home, "verify", "--nproc", "999", "--json", str(tmp_path / "r.json"))
    line = assert_usage_error(run, "--nproc 999:", "use at most")
    assert "without a GPU each rank needs a core" in line
    assert not (tmp_path / "r.json").exists()
