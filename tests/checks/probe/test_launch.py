"""The launch context: each engine's variables normalised, a partial environment refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checks.probe.launch import LaunchContext, LaunchError, read_launch

ROOT = Path(__file__).resolve().parents[3]

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job7",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "gpu-001",
    "MASTER_PORT": "29400",
}
# What srun gives task 3 of `srun -N2 --ntasks-per-node=2` on the second node (srun(1) OUTPUT ENVIRONMENT).
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu-[001-003,007]",
    "SLURM_STEP_NODELIST": "gpu-[001,003]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "gpu-003",
}


def test_torchrun() -> None:
    ctx = read_launch(TORCHRUN, "box")
    assert ctx == LaunchContext("torchrun", 5, 1, 8, 4, 1, "box", "gpu-001", 29400, "job7", ())
    assert not ctx.is_node_leader


def test_slurm_task_named_by_slurmd_not_hostname() -> None:
    ctx = read_launch(SLURM, "ip-10-0-3-7")
    assert (ctx.engine, ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == ("slurm", 3, 1, 4, 2)
    assert (ctx.node_index, ctx.node_name, ctx.job_id) == (1, "gpu-003", "123456")
    assert ctx.nodes == ("gpu-001", "gpu-003")  # the step's nodes win over the job's
    assert (ctx.master_addr, ctx.master_port) == ("gpu-001", 15000 + 3456)


def test_slurm_job_nodelist_when_no_step_list() -> None:
    env = {k: v for k, v in SLURM.items() if k not in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")}
    ctx = read_launch({**env, "SLURM_NTASKS": "8"}, "x")
    assert ctx.nodes == ("gpu-001", "gpu-002", "gpu-003", "gpu-007")
    assert ctx.local_world_size == 2  # 8 tasks over 4 nodes


def test_torchrun_under_slurm_ranks_from_torchrun_name_from_slurm() -> None:
    ctx = read_launch({**SLURM, **TORCHRUN}, "ip-10-0-3-7")
    assert (ctx.engine, ctx.rank, ctx.node_index, ctx.world_size) == ("torchrun", 5, 1, 8)
    assert (ctx.node_name, ctx.job_id, ctx.nodes) == ("gpu-003", "123456", ("gpu-001", "gpu-003"))


def test_skypilot() -> None:
    env = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.0.0.4\n10.0.0.5\n"}
    ctx = read_launch(env, "sky-head")
    ips = ("10.0.0.4", "10.0.0.5")
    first = "SKYPILOT_NODE_IPS' first address"  # the rendezvous address's source, named when it does not resolve
    assert ctx == LaunchContext("skypilot", 1, 0, 2, 1, 1, "10.0.0.5", "10.0.0.4", 29500, "", ips, first)


def test_preset_env() -> None:
    ctx = read_launch({"MASTER_ADDR": "10.1.1.1", "NODE_RANK": "2", "WORLD_SIZE": "32"}, "node2")
    assert (ctx.engine, ctx.node_index, ctx.rank, ctx.world_size, ctx.node_name) == ("env", 2, 2, 32, "node2")
    assert (ctx.master_addr, ctx.master_port) == ("10.1.1.1", 29500)


def test_world_size_alone_is_no_launch() -> None:
    ctx = read_launch({"WORLD_SIZE": "16", "MASTER_ADDR": "10.1.1.1"}, "box")
    assert ctx == LaunchContext("none", 0, 0, 1, 1, 0, "box", "127.0.0.1", 29500)


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({k: v for k, v in TORCHRUN.items() if k != "GROUP_RANK"}, "GROUP_RANK is not set"),
        ({**TORCHRUN, "RANK": "five"}, "RANK='five' is not a whole number"),
        ({k: v for k, v in SLURM.items() if k != "SLURMD_NODENAME"}, "SLURMD_NODENAME is not set"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_NTASKS"}, "SLURM_NTASKS is not set"),
        ({k: v for k, v in SLURM.items() if "NODELIST" not in k}, "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2"}, "SKYPILOT_NODE_IPS is not set"),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "3", "SKYPILOT_NODE_IPS": "a b"}, "lists 2 addresses"),
        ({"NODE_RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
        ({**TORCHRUN, "RANK": "8"}, "rank 8 is not below the world size 8"),
        ({**SLURM, "SLURM_NODEID": "5", "SLURM_STEP_TASKS_PER_NODE": "2(x6)"}, "node index 5 is past the 2 nodes"),
    ],
)
def test_partial_env_names_the_variable(env: dict[str, str], missing: str) -> None:
    with pytest.raises(LaunchError, match=missing.replace("(", r"\(").replace("[", r"\[")):
        read_launch(env, "box")


@pytest.mark.slow
def test_real_torchrun_workers(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import dataclasses, json, sys
            sys.path.insert(0, {str(ROOT)!r})
            from checks.probe.launch import launch_context
            print("CTX " + json.dumps(dataclasses.asdict(launch_context())), flush=True)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SKYPILOT", "TORCHELASTIC"))}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(script)],
        capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"}, check=True,
    )  # fmt: skip
    seen = sorted((json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("CTX ")),
                  key=lambda ctx: ctx["rank"])  # fmt: skip
    assert [(c["engine"], c["rank"], c["local_rank"], c["world_size"], c["local_world_size"]) for c in seen] == [
        ("torchrun", 0, 0, 2, 2),
        ("torchrun", 1, 1, 2, 2),
    ]
    assert {c["node_index"] for c in seen} == {0}
    assert len({c["job_id"] for c in seen}) == 1 and seen[0]["master_port"] > 0
