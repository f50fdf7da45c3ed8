"""``invoke bootstrap --hook``: this node's fast checks for a Slurm Prolog, Epilog or HealthCheckProgram.

Only the checks that judge facts already read (driver, torch build, GPU state, host resources, NCCL variables):
no benchmark, no disk or network measurement, no allocator step, so the run fits the budget
(``preflight.slurm.hook_budget_s``; Slurm kills a HealthCheckProgram after 60 s). A FAIL makes the node
unhealthy (exit 1) with one reason line, the drain reason itself; a check that crashed (ERROR) does not, because a
failing Prolog drains the node and a bug of this tool must not take nodes out of service. With ``drain`` the hook
drains its own node when unhealthy and resumes it when healthy if gpu-preflight drained it (``provision.slurm``).

A node where no GPU is visible is judged as a CPU node (clusters have CPU partitions, and the same hook runs on
every node) unless it is expected to have GPUs: ``expect_gpus`` (``--expect-gpus N``), else the ``gpu`` count of
the node's ``Gres`` in ``scontrol show node -o NODE``. A node with fewer GPUs than expected fails ``node-gpus``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from checks.config import PreflightConfig
from checks.errors import PreflightError
from checks.machine.runner import CHECKS, run_checks
from checks.probe import LocalProbe, Probe, SnapshotProbe
from checks.result import Report, Result, fail, ok
from provision import slurm

# The checks that read facts only (bootstrap's others measure: benchmarks, P2P and all-reduce, disks, downloads,
# or advise: dataloader workers, the allocator setting).
FAST_CHECK_IDS = (
    "driver", "gpu-inventory", "torch-build", "cuda-compat", "torch-arch", "torch-libs", "gpu-power", "gpu-pcie",
    "gpu-nvlink", "gpu-throttle", "gpu-ecc", "gpu-mig", "gpu-processes", "gpu-persistence", "gpu-compute-mode",
    "gpu-topology", "cpu-cores", "ram", "shm", "ulimits", "nccl-env",
)  # fmt: skip
FAST_CHECKS = tuple(item for item in CHECKS if item[0] in FAST_CHECK_IDS)


@dataclass(frozen=True)
class HookRequest:
    """One hook run on node ``node`` (the scheduler's name), of this machine or a replayed snapshot."""

    config: PreflightConfig
    node: str
    machine: Path | None = None
    drain: bool = False
    runner: slurm.Runner = slurm.run_scontrol
    expect_gpus: int = -1  # -1: the gpu count of the node's Gres in Slurm; 0: a CPU node


@dataclass(frozen=True)
class HookOutcome:
    """The exit code (0 healthy, 1 unhealthy), the one reason line, and what ``drain`` did."""

    code: int
    reason: str
    report: Report
    elapsed_s: float
    drained: slurm.Drain | None = None
    resumed: bool = False
    note: str = ""  # a scontrol failure while resuming a healthy node: said, but the node stays healthy


def _probe(request: HookRequest) -> Probe:
    if request.machine:
        return SnapshotProbe(request.machine)
    cfg = request.config
    budget = cfg.slurm.hook_budget_s
    # The torch child and nvcc are the slow readers; bound them so that the whole run fits the budget.
    return LocalProbe(min(cfg.probe.torch_timeout_s, budget / 2), min(cfg.env.nvcc_timeout_s, budget / 4))


def _judge(request: HookRequest, start: float) -> tuple[Report, slurm.Drain | None]:
    cfg = request.config
    probe = _probe(request)
    facts = probe.machine()
    results = _as_expected(run_checks(facts, cfg, FAST_CHECKS), len(facts.nvml.gpus), request)
    report = Report(host=request.node, machine=probe.label, results=tuple(results))
    plan = slurm.drain_for(request.node, report.results, cfg.slurm.reason_max_chars)
    spent = time.monotonic() - start
    if plan is None and spent > cfg.slurm.hook_budget_s:
        reason = f"{slurm.PREFIX} hook took {spent:.1f} s, over its {cfg.slurm.hook_budget_s:g} s budget"
        plan = slurm.Drain(request.node, reason[: cfg.slurm.reason_max_chars])
    return report, plan


def _expected(request: HookRequest) -> tuple[int, str]:
    """The GPUs this node should have and who says so; (0, why) when Slurm cannot be asked (not a drain: a
    HealthCheckProgram while slurmctld is down must not take the node out of service)."""
    if request.expect_gpus >= 0:
        return request.expect_gpus, f"--expect-gpus {request.expect_gpus}"
    try:
        state = slurm.node_state(request.node, request.runner, request.config.slurm.scontrol_timeout_s)
    except PreflightError:
        return 0, f"Slurm's Gres of {request.node} unreadable"
    return state.gpus, f"Slurm's Gres of {request.node}: {state.gres or '(null)'}"


def _as_expected(results: list[Result], found: int, request: HookRequest) -> list[Result]:
    """A node without GPUs and none expected is a CPU node: its driver row is ok. Fewer GPUs than expected fail."""
    expected, source = _expected(request) if found == 0 or request.expect_gpus > 0 else (found, "")
    if found == 0 and expected == 0:
        summary = f"no GPU here and none expected ({source}): judged as a CPU node"
        return [ok("driver", summary) if r.id == "driver" else r for r in results]
    if found < expected:
        hint = "a GPU fell off the bus or is not passed in (nvidia-smi), or the expected count is wrong"
        results = [*results, fail("node-gpus", f"{found} GPU(s) visible, {expected} expected ({source})", hint)]
    return results


def run_hook(request: HookRequest) -> HookOutcome:
    """Run the fast checks; with ``drain``, drain this node when unhealthy or resume it when healthy and ours."""
    start = time.monotonic()
    report, plan = _judge(request, start)
    timeout = request.config.slurm.scontrol_timeout_s
    if plan is not None:
        failed = _drain(plan, request.runner, timeout) if request.drain else ""
        reason = plan.reason + (f" (drain failed: {failed})" if failed else "")
        drained = plan if request.drain and not failed else None
        return HookOutcome(1, reason, report, time.monotonic() - start, drained=drained)
    resumed, note = _resume(request.node, request.runner, timeout) if request.drain else (False, "")
    return HookOutcome(0, "", report, time.monotonic() - start, resumed=resumed, note=note)


def _drain(plan: slurm.Drain, runner: slurm.Runner, timeout_s: float) -> str:
    """Drain; the one-line scontrol error, or '' when it worked."""
    try:
        slurm.drain(plan, runner, timeout_s)
    except PreflightError as exc:
        return str(exc).removeprefix("gpu-preflight: ")
    return ""


def _resume(node: str, runner: slurm.Runner, timeout_s: float) -> tuple[bool, str]:
    """Resume the node if gpu-preflight drained it: (resumed, the scontrol error or '')."""
    try:
        return slurm.resume_if_ours(node, runner, timeout_s) is not None, ""
    except PreflightError as exc:
        return False, f"resume of {node} failed: {str(exc).removeprefix('gpu-preflight: ')}"
