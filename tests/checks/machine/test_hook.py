"""bootstrap --hook: the fast checks on replayed snapshots (and once live), one reason line, drain and resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.config import make_config
from checks.machine.hook import FAST_CHECK_IDS, HookRequest, run_hook
from checks.result import Status
from tests.provision.test_slurm import HEALTHY, OURS, THEIRS, FakeScontrol

MACHINES = Path(__file__).resolve().parents[2] / "fixtures" / "machines"
CFG = make_config()


def test_healthy_node_exits_0_with_fast_checks_only() -> None:
    fake = FakeScontrol([OURS])
    outcome = run_hook(HookRequest(CFG, "gpu-017", MACHINES / "h100-sxm-8x-healthy.json", runner=fake))
    assert (outcome.code, outcome.reason, outcome.drained, outcome.resumed) == (0, "", None, False)
    ids = {r.id for r in outcome.report.results}
    assert ids <= set(FAST_CHECK_IDS) and "driver" in ids and "gpu-power" in ids
    assert not ids & {"gpu-bench", "gpu-allreduce", "disk-speed", "net-download", "alloc-conf"}
    assert fake.calls == []  # nothing touches Slurm without --drain
    assert outcome.report.host == "gpu-017"


def test_power_capped_is_a_warning_not_unhealthy() -> None:
    outcome = run_hook(HookRequest(CFG, "n1", MACHINES / "rtx4090-power-capped.json"))
    assert outcome.code == 0
    assert next(r.status for r in outcome.report.results if r.id == "gpu-power") is Status.WARN


def test_broken_node_exits_1_with_one_reason_line() -> None:
    fake = FakeScontrol([])
    outcome = run_hook(HookRequest(CFG, "gpu-017", MACHINES / "gpu-lost.json", runner=fake))
    assert outcome.code == 1
    assert outcome.reason.startswith("gpu-preflight: gpu-inventory gpu1 NVIDIA H100 80GB HBM3: GPU is lost")
    assert "\n" not in outcome.reason and len(outcome.reason) <= CFG.slurm.reason_max_chars
    assert fake.calls == [] and outcome.drained is None


def test_drain_drains_the_unhealthy_node() -> None:
    fake = FakeScontrol([])
    outcome = run_hook(HookRequest(CFG, "n2", MACHINES / "remapped-rows-pending.json", drain=True, runner=fake))
    assert outcome.code == 1 and outcome.drained is not None
    assert fake.calls == [["scontrol", "update", "NodeName=n2", "State=DRAIN", f"Reason={outcome.reason}"]]


def test_drain_that_fails_stays_unhealthy_and_says_why() -> None:
    fake = FakeScontrol([], FileNotFoundError(2, "No such file or directory", "scontrol"))
    outcome = run_hook(HookRequest(CFG, "n2", MACHINES / "gpu-lost.json", drain=True, runner=fake))
    assert outcome.code == 1 and outcome.drained is None
    assert outcome.reason.endswith(
        "(drain failed: scontrol is not installed here (run on a node of the Slurm cluster))"
    )


@pytest.mark.parametrize(("line", "resumed"), [(OURS, True), (THEIRS, False), (HEALTHY, False)])
def test_healthy_run_resumes_only_its_own_drain(line: str, resumed: bool) -> None:
    fake = FakeScontrol([line])
    node = line.split()[0].removeprefix("NodeName=")
    outcome = run_hook(HookRequest(CFG, node, MACHINES / "h200-1x.json", drain=True, runner=fake))
    assert (outcome.code, outcome.resumed) == (0, resumed)
    assert (["scontrol", "update", f"NodeName={node}", "State=RESUME"] in fake.calls) is resumed


def test_resume_failure_keeps_the_node_healthy() -> None:
    fake = FakeScontrol([], FileNotFoundError(2, "No such file or directory", "scontrol"))
    outcome = run_hook(HookRequest(CFG, "n1", MACHINES / "h200-1x.json", drain=True, runner=fake))
    assert (outcome.code, outcome.reason) == (0, "")
    assert outcome.note.startswith("resume of n1 failed: scontrol is not installed here")


def test_over_budget_is_unhealthy() -> None:
    cfg = make_config({"slurm": {"hook_budget_s": 0.0}})
    outcome = run_hook(HookRequest(cfg, "n1", MACHINES / "h200-1x.json"))
    assert outcome.code == 1 and outcome.reason.startswith("gpu-preflight: hook took ")
    assert outcome.reason.endswith("over its 0 s budget")


@pytest.mark.slow
def test_live_on_this_box_within_budget() -> None:
    outcome = run_hook(HookRequest(CFG, "this-box"))
    failed = [r for r in outcome.report.results if r.status is Status.FAIL]
    assert outcome.elapsed_s < CFG.slurm.hook_budget_s
    assert outcome.code == (1 if failed else 0)
    assert outcome.reason.startswith(f"gpu-preflight: {failed[0].id}" if failed else "")
