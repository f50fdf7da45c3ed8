"""verify --nproc, the pure parts both paths of verify share: how many processes run, the straggler and comm-bound
rules' figures (``checks/verify/distributed.py``, which the command judge and the diagnosis read), and the
straggler verdict's words about the rank's GPU. Two real gloo ranks of the tool's script are
test_planted_ddp.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from checks.config import make_config
from checks.errors import PreflightError
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.probe.host import read_host
from checks.reports.verify import DdpFigures, RankRow
from checks.result import Result
from checks.verify import distributed

CFG = make_config().verify


def cpu_box(cores: float = 2.0, gpus: int = 0) -> MachineFacts:
    host = dataclasses.replace(read_host(), cpu_affinity=int(cores), cpu_logical=int(cores), cgroup_cpu_quota=None)
    return MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(device_count=gpus), host)


def test_nproc_defaults_to_every_gpu_when_there_are_two_or_more() -> None:
    assert distributed.processes(0, CFG, cpu_box(gpus=4)) == 4
    assert distributed.processes(0, CFG, cpu_box(gpus=1)) == 1
    assert distributed.processes(0, CFG, cpu_box(gpus=0)) == 1
    assert distributed.processes(1, CFG, cpu_box(gpus=4)) == 1


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


def straggling_on_gpu1(gate: list[Result] | None) -> Any:
    """Two NCCL ranks, rank 1 on gpu1 30% slower on its own, as the command judge gives them to the diagnosis."""
    from checks.verify.diagnosis import Signals, diagnose

    rows = (RankRow(0, median_s=0.1, own_s=0.040, gpu=0), RankRow(1, median_s=0.1, own_s=0.052, gpu=1))
    d = DdpFigures(world_size=2, backend="nccl", per_rank=rows, comm_exposed_ms=20.0, comm_share=0.2)
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
    """Under CUDA_VISIBLE_DEVICES=3,1 torch's cuda:0 is NVML's gpu3: the straggler's gpuN is the card bootstrap
    judged (the agent's ``device`` line has the UUID; the parent's NVML order maps it)."""
    from checks.verify.contract import RankDevice
    from checks.verify.events import DeviceLine
    from checks.verify.user import judge as j
    from tests.checks.verify.user.test_judge import step

    order = {0: "GPU-aaaa", 1: "GPU-bbbb", 2: "GPU-cccc", 3: "GPU-DDDD"}
    devices = [
        DeviceLine(t=0.0, pid=11, type="cuda", name="H100", uuid="GPU-dddd", index=0),
        DeviceLine(t=0.0, pid=12, type="cuda", name="H100", uuid="bbbb", index=1),  # torch >= 2.1
    ]
    events = devices + [step(i, pid=p, rank=r) for i in range(1, 5) for p, r in ((11, 0), (12, 1))]
    found = j.ranks(events, 1, 3, 0)
    assert [x.gpu for x in j.rank_rows(found, nvml_uuids=order).per_rank] == [3, 1]
    assert [x.gpu for x in j.rank_rows(found).per_rank] == [0, 1]  # no NVML here: torch's index on its host
    assert distributed.gpu_of(RankDevice("cuda", 1, "GPU-b", nvml_index=0)) == 0
    unknown = DeviceLine(t=0.0, pid=13, type="cuda", name="H100", uuid="GPU-zz", index=1)
    assert distributed.gpu_of(j.rank_device(unknown, order)) == 1
    assert distributed.gpu_of(j.rank_device(None, order)) is None  # no device line: the CPU
