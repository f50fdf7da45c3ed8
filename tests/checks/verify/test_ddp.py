"""verify --nproc: DistributedDataParallel with gloo, two real processes on this CPU machine.

The slow tests run verify's pipeline below the CLI (plan -> the ranks under the sampler -> judge) with planted
models from ``smoke_plugins`` (rank 1 slowed, crashing or hanging; a model of many gradient bytes). The fast ones
judge the planning and the figures as pure functions.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from checks.config import PreflightConfig, make_config
from checks.errors import PreflightError
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.probe.host import read_host
from checks.reports.verify import Device, RankRow
from checks.result import Result
from checks.verify import distributed
from checks.verify.contract import ChildResult, ChildRun, CommAb, RankDdp, RankDevice, RankResult, Solo, Step
from checks.verify.plan import Options, Outcome, plan, run
from checks.verify.report import judge
from tests.checks.verify import smoke_plugins
from tests.fakes.verdicts import planted_row

REPO = Path(__file__).resolve().parents[3]
PLUGINS = "tests.checks.verify.smoke_plugins"
CFG = make_config().verify


def config(**verify: Any) -> PreflightConfig:
    cfg = make_config()
    small = {"steps": 8, "warmup": 2, "image_size": 16, "sample_interval_s": 0.1, "ddp_windows": 2}
    small |= {"ddp_window_steps": 3, "ddp_solo_steps": 4, "stall_timeout_s": 60.0, "timeout_s": 240.0}
    return dataclasses.replace(cfg, verify=dataclasses.replace(cfg.verify, **(small | verify)))


def cpu_box(cores: float = 2.0, gpus: int = 0) -> MachineFacts:
    host = dataclasses.replace(read_host(), cpu_affinity=int(cores), cpu_logical=int(cores), cgroup_cpu_quota=None)
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(device_count=gpus), host)


def ddp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: PreflightConfig, **options: Any
) -> tuple[Outcome, dict[str, Result], dict[str, Any], list[int]]:
    """Run verify --nproc 2 below the CLI; return the outcome, results by id, measurements and rank 0's pid (the
    ranks' process group)."""
    import checks.verify.plan as plan_module

    monkeypatch.chdir(REPO)
    groups: list[int] = []
    launch = plan_module.launch

    def recording(spec: Any, timeout_s: float, stall_s: float, on_event: Any, on_start: Any, **kw: Any) -> Any:
        def started(pid: int) -> None:
            groups.append(pid)
            on_start(pid)

        return launch(spec, timeout_s, stall_s, on_event, started, **kw)

    monkeypatch.setattr(plan_module, "launch", recording)
    opts = Options(json=str(tmp_path / "r.json"), nproc=2, workers=0, dataset=f"{PLUGINS}:patterned", **options)
    with ExitStack() as stack:
        p, _ = plan(opts, cfg, lambda: cpu_box(), stack)
        outcome = run(p, cfg, lambda e: None)
        results, measurements, _ = judge(p, outcome, cfg.verify)
    return outcome, {r.id: r for r in results}, measurements.to_json(), groups


def no_process_in_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_two_ranks_measure_the_exchange_and_judge_it_comm_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, results, m, _ = ddp(tmp_path, monkeypatch, config(), model=f"{PLUGINS}:wide_model")
    d = m["ddp"]
    assert (d["world_size"], d["backend"]) == (2, "gloo")
    model = smoke_plugins.wide_model()
    assert d["grad_bytes"] == sum(p.numel() * 4 for p in model.parameters())  # fp32: exactly what DDP reduces
    assert [r["rank"] for r in d["per_rank"]] == [0, 1]
    assert all(r["own_s"] > 0 and r["sync_s"] > 0 and r["median_s"] > 0 for r in d["per_rank"])
    own = outcome.child.result.ddp if outcome.child.result else None
    assert own is not None and own.comm_ab is not None and own.comm_ab.no_sync_s is not None
    assert len(own.comm_ab.no_sync_s) == 2 * 3  # 2 windows x 3 steps each leg
    assert d["comm_exposed_ms"] > 0 and d["comm_share"] >= CFG.share_warn, d
    assert 0 < d["scaling_efficiency"] < 1.5
    assert planted_row(m)["id"] == "comm-bound", results["diagnosis"].summary
    verdict = planted_row(m)
    assert verdict["evidence"]["grad_bytes"] == d["grad_bytes"] and "32 MB all-reduced" in verdict["summary"]
    assert verdict["fix"].startswith("1) sync every"), verdict["fix"]  # the largest measured saving first
    assert results["verify-ddp"].status.value == "ok"
    # the checkpoint round trip under DDP: rank 0 saved, every rank restored, the same batches replayed
    assert results["verify-checkpoint"].status.value == "ok", results["verify-checkpoint"].summary
    assert results["verify-data-resume"].status.value == "ok", results["verify-data-resume"].summary


@pytest.mark.slow
def test_a_slow_rank_is_named_as_the_straggler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, m, _ = ddp(tmp_path, monkeypatch, config(), model=f"{PLUGINS}:straggler_model")
    ids = [v["id"] for v in m["diagnosis"]["verdicts"]]
    assert "straggler" in ids, m["diagnosis"]
    found = next(v for v in m["diagnosis"]["verdicts"] if v["id"] == "straggler")
    assert found["evidence"]["rank"] == 1 and found["summary"].startswith("rank 1 (CPU) takes "), found["summary"]
    assert found["evidence"]["gpu"] is None and "rank 1's cores" in found["fix"]
    rows = {r["rank"]: r for r in m["ddp"]["per_rank"]}
    assert rows[1]["own_s"] - rows[0]["own_s"] > 0.02  # the planted 40 ms, less scheduling noise


@pytest.mark.slow
def test_a_crashing_rank_stops_every_rank_and_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, results, _, groups = ddp(tmp_path, monkeypatch, config(), model=f"{PLUGINS}:crashing_model")
    loop = results["verify-loop"]
    assert outcome.child.failure == "crashed" and outcome.child.rank == 1
    assert loop.status.value == "fail" and "rank 1: RuntimeError: planted failure on rank 1" in loop.summary
    assert "planted failure on rank 1" in (loop.hint or "")  # the rank's own last output
    assert outcome.child.seconds < 60  # stopped at once, not after the collective timeout
    assert groups and no_process_in_group(groups[0])


@pytest.mark.slow
def test_a_hanging_rank_stalls_out_and_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(stall_timeout_s=8.0)
    outcome, results, _, groups = ddp(tmp_path, monkeypatch, cfg, model=f"{PLUGINS}:hanging_model")
    assert outcome.child.failure == "stalled"
    assert results["verify-loop"].status.value == "fail" and "stopped reporting" in results["verify-loop"].summary
    assert groups and no_process_in_group(groups[0])  # every rank and worker of the group is gone


# --- planning and figures (pure) ---


def test_nproc_defaults_to_every_gpu_when_there_are_two_or_more() -> None:
    assert distributed.processes(0, CFG, cpu_box(gpus=4)) == 4
    assert distributed.processes(0, CFG, cpu_box(gpus=1)) == 1
    assert distributed.processes(0, CFG, cpu_box(gpus=0)) == 1
    assert distributed.processes(1, CFG, cpu_box(gpus=4)) == 1
    assert distributed.spec_block(1, CFG, cpu_box(gpus=4)) is None  # --nproc 1: the one-process run


@pytest.mark.parametrize(
    ("nproc", "box", "words"),
    [
        (5, cpu_box(gpus=4), "--nproc 5: torch sees 4 GPU(s) here; use at most 4"),
        (3, cpu_box(cores=2.0), "--nproc 3: without a GPU each rank needs a core and 2 are usable here"),
        (-1, cpu_box(), "--nproc must be 1 or more, got -1"),
    ],
)
def test_bad_nproc_is_one_line_naming_the_limit(nproc: int, box: MachineFacts, words: str) -> None:
    with pytest.raises(PreflightError) as err:
        distributed.processes(nproc, CFG, box)
    assert words in str(err.value)


def test_the_cpu_ranks_share_the_cores_and_gpu_ranks_use_nccl() -> None:
    cpu = distributed.spec_block(2, CFG, cpu_box(cores=4.0))
    gpu = distributed.spec_block(2, CFG, cpu_box(gpus=2))
    assert cpu is not None and gpu is not None
    assert (cpu.backend, cpu.threads) == ("gloo", 2)
    assert gpu.backend == "nccl"
    assert "gloo on the CPU, 2 thread(s) each of 4 usable cores" in distributed.describe(cpu, 4.0)


def rank_result(rank: int, step: float, own: float, sync: float, **device: Any) -> ChildResult:
    """One rank's result: three steps of ``step`` s, its no_sync and synchronised medians, batch 16."""
    steps = (Step(0.0, 0.0, step / 2, step / 2, 0.0),) * 3
    ddp = RankDdp(rank, 2, "nccl" if device else "gloo", CommAb(sync_median_s=sync, no_sync_median_s=own))
    return ChildResult(steps=steps, ddp=ddp, batch_size=16, device=Device(**device) if device else None)


def test_figures_take_the_exchange_from_the_slowest_rank_and_the_scaling_from_the_solo_leg() -> None:
    ranks = [rank_result(0, 0.100, 0.050, 0.090), rank_result(1, 0.100, 0.060, 0.090)]
    ab = CommAb(0.09, 0.05, 2, 3, (0.09,), (0.05,), grad_bytes=100_000_000)
    r = ChildResult(
        batch_size=16,
        ddp=RankDdp(0, 2, "gloo", ab, Solo(4, 0.08)),
        ranks=tuple(RankResult(i, x.steps, x.ddp) for i, x in enumerate(ranks)),
    )
    d = distributed.figures(r)
    assert d is not None
    assert d.comm_exposed_ms == pytest.approx(30.0)  # rank 1: 90 - 60, not rank 0's 40 (it also waits for 1)
    assert d.comm_share == pytest.approx(0.3)
    assert d.scaling_efficiency == pytest.approx(0.8)  # 2 x 16 / 0.1 over 2 x (16 / 0.08)
    assert d.busbw_gbs == pytest.approx(100e6 * 2 * 1 / 2 / 0.030 / 1e9, rel=1e-3)


def test_sync_every_k_is_the_smallest_k_under_the_target() -> None:
    assert distributed.accumulation(0.30, 0.10) == 4  # 0.075 / 0.775 = 9.7%; k=3: 0.1 / 0.8 = 12.5%
    assert distributed.accumulation(0.05, 0.10) == 2


def test_a_straggler_needs_the_configured_gap() -> None:
    rows = [RankRow(0, own_s=0.050), RankRow(1, own_s=0.051), RankRow(2, own_s=0.080)]
    found = distributed.straggler(rows, CFG)
    assert found is not None and found["rank"] == 2 and found["score"] == pytest.approx(0.58, abs=0.01)
    assert distributed.straggler(rows[:2], CFG) is None
    # 40% slower on its own, but 1.7 ms of a 22 ms step (under share_warn): noise on a busy box, not a straggler.
    small = [RankRow(0, median_s=0.022, own_s=0.0045), RankRow(1, median_s=0.022, own_s=0.0062)]
    assert distributed.straggler(small, CFG) is None
    wide = [RankRow(0, median_s=0.020, own_s=0.0012), RankRow(1, median_s=0.020, own_s=0.0190)]  # 89% of the step
    assert (distributed.straggler(wide, CFG) or {}).get("rank") == 1


class NvmlOrder:
    """The parent's GpuReader as far as ``plan._nvml_indices`` asks it: UUID -> NVML index."""

    def __init__(self, order: dict[str, int]) -> None:
        self.order = order

    def index_of(self, uuid: str | None) -> int | None:
        return self.order.get(uuid or "")


def straggling_on_gpu1(gate: list[Result] | None) -> Any:
    """Two NCCL ranks replayed through the launcher's combine and the NVML lookup; rank 1 (on gpu1) 30% slower."""
    from checks.verify.diagnosis import Signals, diagnose
    from checks.verify.plan import _nvml_indices
    from checks.verify.smoke.launch import combine

    results: list[ChildResult | None] = [
        rank_result(rank, 0.1, own, 0.12, type="cuda", name="NVIDIA RTX 4090", uuid=f"GPU-{rank}aaa")
        for rank, own in ((0, 0.040), (1, 0.052))
    ]
    run = ChildRun(result=None)
    combine(run, results, ["", ""])
    _nvml_indices(run, NvmlOrder({"GPU-0aaa": 0, "GPU-1aaa": 1}))  # type: ignore[arg-type]
    assert run.result is not None
    d = distributed.figures(run.result)
    shares = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.4, "backward": 0.5, "optimizer": 0.1, "checkpoint": 0.0}
    signals = Signals(
        steps=20, device="cuda", shares=shares, step_s=0.1, ddp=d, gate=None if gate is None else tuple(gate)
    )
    return next(v for v in diagnose(signals, CFG) if v.id == "straggler")


def test_the_straggler_names_its_gpu_and_quotes_what_bootstrap_found_on_it() -> None:
    from checks.result import ok, warn

    power = warn(
        "gpu-power",
        "power limit 250 W is 56% of the default 450 W",
        "the card is capped: nvidia-smi -i 1 -pl 450",
        subject="gpu1",
    )
    gate = [
        ok("driver", "driver 550.54"),
        warn("gpu-power", "power limit 300 W is 67% of the default 450 W", "capped", subject="gpu0"),
        ok("gpu-pcie", "Gen4 x16 under load", subject="gpu1"),
        power,
        warn("gpu-throttle", "clocks held back: software power cap, 71 C", "power: see gpu-power", subject="gpu1"),
    ]
    v = straggling_on_gpu1(gate)
    assert v.summary.startswith("rank 1 (gpu1) takes 52.0 ms per step on its own, the others 40.0 ms (30% slower)")
    assert (
        "bootstrap flags gpu1: gpu-power warn: power limit 250 W is 56% of the default 450 W; "
        "gpu-throttle warn: clocks held back: software power cap, 71 C"
    ) in v.summary
    assert "300 W" not in v.summary and "Gen4" not in v.summary  # gpu0's warn and gpu1's ok rows stay out
    assert (v.evidence["rank"], v.evidence["gpu"], v.evidence["device"]) == (1, 1, "gpu1")
    assert [r["id"] for r in v.evidence["bootstrap"]] == ["gpu-power", "gpu-throttle"]
    assert v.evidence["bootstrap_says"] in v.summary
    assert "nvidia-smi -i 1 -pl 450" in v.fix  # bootstrap's own hint for that GPU


def test_a_straggler_on_a_gpu_bootstrap_passed_says_so() -> None:
    from checks.result import ok

    v = straggling_on_gpu1([ok("gpu-power", "power limit 450 W is 100% of the default 450 W", subject="gpu1")])
    assert v.summary.endswith("; bootstrap found nothing wrong with gpu1")
    assert v.evidence["bootstrap"] == [] and "nvidia-smi -i 1 dmon" in v.fix
    assert "not in this report" in straggling_on_gpu1(None).summary  # judged without the gate: no false all-clear


def test_a_ranks_gpu_is_its_nvml_index_where_the_uuid_maps_else_its_torch_index() -> None:
    assert distributed.gpu_of(RankDevice("cuda", 1, "GPU-b", nvml_index=0)) == 0
    assert distributed.gpu_of(RankDevice("cuda", 1, "GPU-b", nvml_index=None)) == 1
    assert distributed.gpu_of(RankDevice("cpu", None, None)) is None
    assert distributed.gpu_of(None) is None


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_writes_the_partial_report_and_exits_130(tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.fakes.cli import by_id, child_env, default_sigint

    home = tmp_path / "home"
    home.mkdir()
    env = child_env(home) | {
        "INVOKE_PREFLIGHT_VERIFY_IMAGE_SIZE": "16",
        "INVOKE_PREFLIGHT_VERIFY_BATCH_SIZE_CPU": "16",
        "INVOKE_PREFLIGHT_VERIFY_WARMUP": "1",
    }
    argv = [sys.executable, "-m", "invoke", "verify", "--nproc", "2", "--steps", "400", "--workers", "0"]
    argv += ["--json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )  # a suite started as a background job has SIGINT ignored: the child must hear it as from a terminal
    seen, deadline, family = "", time.monotonic() + 120, set()
    assert proc.stderr is not None
    while "step 10 (measured)" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
        family |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert "2 processes, DistributedDataParallel (gloo on the CPU) under torchrun" in seen, seen
    proc.send_signal(signal.SIGINT)  # what a terminal sends to the foreground process
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    report = json.loads((tmp_path / "r.json").read_text())
    loop = by_id(report)["verify-loop"]
    assert loop["status"] == "warn" and loop["summary"].startswith("interrupted"), loop
    assert 9 <= report["measurements"]["step_time"]["steps"] < 400  # step 10, the warm-up one excluded
    time.sleep(0.5)
    assert len(family) >= 2  # both ranks were seen, and none is left
    assert not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


@pytest.mark.slow
def test_nproc_beyond_the_cores_exits_2_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.fakes.cli import child_env

    home = tmp_path / "home"
    home.mkdir()
    argv = [sys.executable, "-m", "invoke", "verify", "--nproc", "999", "--json", str(tmp_path / "r.json")]
    done = subprocess.run(argv, cwd=REPO, env=child_env(home), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--nproc 999:" in done.stderr and "use at most" in done.stderr
    assert "Traceback" not in done.stderr
