"""Remediation in Slurm's terms: drain commands, the exclude list, the resume rule behind a fake scontrol."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from checks.result import Result, Status
from provision.slurm import (
    Drain,
    SlurmError,
    drain,
    drain_for,
    exclude_option,
    node_state,
    parse_node_line,
    render_remediation,
    resume_if_ours,
)

# `scontrol show node -o` lines as Slurm 22.05 prints them (one node per line; the reason last, with its
# [user@time]; OS= holds spaces).
COMMON = (
    "Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.52 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=10.0.3.17 NodeHostName=gpu-017 Version=22.05.8 "
    "OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023 RealMemory=1031000 AllocMem=0 "
    "FreeMem=1012345 Sockets=2 Boards=1"
)
TAIL = (
    "ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-11-30T08:12:44 "
    "SlurmdStartTime=2026-11-30T08:14:02 LastBusyTime=2026-12-02T05:59:10 "
    "CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
OURS = f"NodeName=gpu-017 {COMMON} State=IDLE+DRAIN {TAIL} Reason=gpu-preflight: gpu-nvlink gpu3 0/18 links [root@2026-12-02T06:01:33]"
THEIRS = f"NodeName=gpu-018 {COMMON} State=IDLE+DRAIN {TAIL} Reason=NHC: check_fs_mount: /scratch not mounted [root@2026-12-01T22:10:05]"
HEALTHY = f"NodeName=gpu-019 {COMMON} State=MIXED {TAIL}"
DOWN_OURS = f"NodeName=gpu-020 {COMMON} State=DOWN+DRAIN+NOT_RESPONDING {TAIL} Reason=gpu-preflight: ram 12/1000 GiB [slurm@2026-12-02T06:02:00]"


class FakeScontrol:
    """Answers ``show node -o NAME`` with the line of that node, records updates, or raises like subprocess does."""

    def __init__(self, lines: list[str], error: Exception | None = None) -> None:
        self.lines = {line.split()[0].removeprefix("NodeName="): line for line in lines}
        self.error = error
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> str:
        self.calls.append(argv)
        if self.error:
            raise self.error
        if argv[:4] == ["scontrol", "show", "node", "-o"]:
            return self.lines[argv[4]] + "\n"
        return ""


def fail(check_id: str, summary: str, subject: str | None = None) -> Result:
    return Result(check_id, Status.FAIL, summary, subject=subject)


def test_drain_command_runs_as_a_shell_reads_it() -> None:
    plan = drain_for("gpu-017", [Result("driver", Status.OK, "ok"), fail("gpu-nvlink", "0/18 links", "gpu3")], 100)
    assert plan == Drain("gpu-017", "gpu-preflight: gpu-nvlink gpu3 0/18 links")
    assert (
        plan.command()
        == "scontrol update NodeName=gpu-017 State=DRAIN Reason='gpu-preflight: gpu-nvlink gpu3 0/18 links'"
    )
    assert shlex.split(plan.command()) == plan.argv()


def test_reason_quotes_and_truncates() -> None:
    plan = drain_for("n2", [fail("ulimits", "nofile 'soft' 1024 $(rm -rf /) \n next"), fail("ram", "low")], 60)
    assert plan is not None and len(plan.reason) == 60 and plan.reason.endswith("...")
    assert plan.reason == "gpu-preflight: ulimits nofile 'soft' 1024 $(rm -rf /) nex..."  # one line
    assert shlex.split(plan.command())[-1] == f"Reason={plan.reason}"
    assert drain_for("n2", [fail("a", "x"), fail("b", "y")], 100).reason == "gpu-preflight: a x (+1 more)"  # type: ignore[union-attr]


def test_no_fail_no_drain() -> None:
    assert drain_for("n1", [Result("ram", Status.WARN, "tight")], 100) is None
    assert render_remediation([]) == [] and exclude_option([]) == ""


def test_render_lists_commands_and_the_exclude_list() -> None:
    lines = render_remediation([Drain("gpu-017", "gpu-preflight: a"), Drain("gpu-021", "gpu-preflight: b")])
    assert lines[1:] == [
        "  scontrol update NodeName=gpu-017 State=DRAIN Reason='gpu-preflight: a'",
        "  scontrol update NodeName=gpu-021 State=DRAIN Reason='gpu-preflight: b'",
        "keep them out of your next job: srun --exclude=gpu-[017,021] ...",
    ]


def test_parse_real_lines() -> None:
    ours, theirs, healthy = parse_node_line(OURS), parse_node_line(THEIRS), parse_node_line(HEALTHY)
    assert (ours.name, ours.state, ours.reason) == (
        "gpu-017",
        "IDLE+DRAIN",
        "gpu-preflight: gpu-nvlink gpu3 0/18 links",
    )
    assert ours.drained and ours.ours
    assert theirs.drained and not theirs.ours and theirs.reason == "NHC: check_fs_mount: /scratch not mounted"
    assert (healthy.drained, healthy.reason) == (False, "")
    with pytest.raises(SlurmError, match="cannot read scontrol's node line"):
        parse_node_line("Node gpu-99 not found")


def test_resume_only_what_we_drained() -> None:
    fake = FakeScontrol([OURS, THEIRS, HEALTHY, DOWN_OURS])
    assert resume_if_ours("gpu-017", fake, 5.0) is not None
    assert resume_if_ours("gpu-020", fake, 5.0) is not None
    assert resume_if_ours("gpu-018", fake, 5.0) is None
    assert resume_if_ours("gpu-019", fake, 5.0) is None
    updates = [call for call in fake.calls if call[1] == "update"]
    assert updates == [
        ["scontrol", "update", "NodeName=gpu-017", "State=RESUME"],
        ["scontrol", "update", "NodeName=gpu-020", "State=RESUME"],
    ]


def test_drain_runs_the_planned_argv() -> None:
    fake = FakeScontrol([])
    drain(Drain("n2", "gpu-preflight: ram low"), fake, 5.0)
    assert fake.calls == [["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=gpu-preflight: ram low"]]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (FileNotFoundError(2, "No such file or directory", "scontrol"), "scontrol is not installed here"),
        (
            subprocess.CalledProcessError(
                1, ["scontrol"], "", "scontrol: error: Invalid user for SlurmUser slurm, update denied\n"
            ),
            "failed with exit 1: scontrol: error: Invalid user for SlurmUser slurm, update denied",
        ),
        (subprocess.TimeoutExpired(["scontrol"], 5.0), "did not answer within 5 s"),
    ],
)
def test_scontrol_errors_are_one_line(error: Exception, message: str) -> None:
    with pytest.raises(SlurmError, match=message) as caught:
        node_state("gpu-017", FakeScontrol([], error), 5.0)
    assert "\n" not in str(caught.value)


def test_gres_counts_the_gpus_slurm_schedules() -> None:
    assert parse_node_line(HEALTHY).gpus == 8 and parse_node_line(HEALTHY).gres == "gpu:h100:8"
    line = HEALTHY.replace("Gres=gpu:h100:8", "Gres=gpu:a100:2(S:0-1),gpu:1,shard:4")
    assert parse_node_line(line).gpus == 3
    cpu = parse_node_line(HEALTHY.replace("Gres=gpu:h100:8", "Gres=(null)"))
    assert (cpu.gres, cpu.gpus) == ("", 0)


def test_the_hook_judges_a_node_without_gpus_by_its_gres() -> None:
    """No driver and no GPU on the machine: a CPU node (healthy) unless Slurm's Gres or --expect-gpus says GPUs."""
    from checks.config import make_config
    from checks.machine.hook import HookRequest, run_hook
    from tests.checks.machine.test_hook import MACHINES

    cpu_box, cfg = MACHINES / "cpu-only-no-driver.json", make_config({})
    cpu_node = FakeScontrol([HEALTHY.replace("gpu-019", "cpu-001").replace("Gres=gpu:h100:8", "Gres=(null)")])
    outcome = run_hook(HookRequest(cfg, "cpu-001", cpu_box, drain=True, runner=cpu_node))
    driver = next(r for r in outcome.report.results if r.id == "driver")
    assert outcome.code == 0 and driver.status is Status.OK and "judged as a CPU node" in driver.summary
    gpu_node = FakeScontrol([HEALTHY])  # gpu-019: Gres=gpu:h100:8
    outcome = run_hook(HookRequest(cfg, "gpu-019", cpu_box, drain=True, runner=gpu_node))
    assert outcome.code == 1 and outcome.reason.startswith("gpu-preflight: driver"), outcome.reason
    counted = next(r for r in outcome.report.results if r.id == "node-gpus")
    assert counted.summary == "0 GPU(s) visible, 8 expected (Slurm's Gres of gpu-019: gpu:h100:8)"
    told = run_hook(HookRequest(cfg, "cpu-001", cpu_box, runner=FakeScontrol([]), expect_gpus=0))
    assert told.code == 0  # --expect-gpus 0: no scontrol call needed
    unreadable = FakeScontrol([], subprocess.TimeoutExpired(["scontrol"], 5.0))
    assert run_hook(HookRequest(cfg, "cpu-001", cpu_box, runner=unreadable)).code == 0  # slurmctld down: no drain
