"""Slurm as its admins and users run it, on the real two-node cluster of tests/slurmcluster.py:
a job script submitted from a project folder runs the user's command there, the hook judges the CPU-only nodes as
CPU nodes, the hinted ``--drain`` is accepted in a job, and a rendezvous address no node resolves fails fast.
Skipped with the reason where not root or Slurm is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.checks.fleet.test_slurm import SHM_NO_NODE_HAS
from tests.slurmcluster import Cluster, cluster, unavailable
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REPO = Path(__file__).resolve().parents[3]
TRAIN = """\
import os, pathlib, time
import torch

pathlib.Path(f"ran-{os.environ.get('RANK', 'x')}.txt").write_text(os.getcwd())
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(400):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.02)  # a training step's pace: the job runs for a while
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def _quick(tmp: Path) -> dict[str, str]:
    """A home of the test's own and short sweeps, as a user's environment passes them to srun (--export=ALL)."""
    return {"HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache"), "INVOKE_PREFLIGHT_NETWORK_ALLREDUCE_BUDGET_S": "2",
            "INVOKE_PREFLIGHT_HOSTS_JOB_WAIT_S": "60", "INVOKE_PREFLIGHT_NETWORK_LINK_SECONDS": "1",
            "INVOKE_PREFLIGHT_VERIFY_STEPS": "4", "INVOKE_PREFLIGHT_VERIFY_WARMUP": "2"}  # fmt: skip


def _state(slurm: Cluster, node: str) -> tuple[str, str]:
    line = slurm.run("sinfo", "-n", node, "-h", "-o", "%t|%E").stdout.strip()
    flags, _, reason = line.partition("|")
    return flags.rstrip("*~#!%$@^-"), reason  # sinfo's suffixes (* not responding yet, ...) are not the state


def _resume(slurm: Cluster, *nodes: str) -> None:
    """Resume the nodes a test drained and wait until they take jobs again, for the module's next test."""
    for node in nodes:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    until(lambda: all(_state(slurm, node)[0] == "idle" for node in nodes), 20, what=f"{', '.join(nodes)} idle again")


def test_sbatch_runs_the_users_command_in_the_folder_sbatch_ran_in(slurm: Cluster, tmp_path: Path) -> None:
    """``invoke -r CHECKOUT sbatch -- python train.py`` from a project folder, submitted from there: the job runs
    train.py from that folder (not the checkout) and writes its reports beside it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN, encoding="utf-8")
    before = set((REPO / "reports").glob("slurm-*"))
    made = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "sbatch", "--nodes", "2", "--gpus-per-node", "0",
         "--time", "10", "--out", "job.sbatch", "--", sys.executable, "train.py"],
        cwd=project, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    env = slurm.env(**_quick(tmp_path), INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S="0")
    job_id = slurm.batch(["job.sbatch"], env, cwd=project)
    log = project / f"gpu-preflight-{job_id}.out"
    text = log.read_text(encoding="utf-8") if log.exists() else "(no log)"
    assert sorted(p.name for p in project.glob("ran-*.txt")) == ["ran-0.txt", "ran-1.txt"], text
    assert (project / "ran-0.txt").read_text(encoding="utf-8") == str(project), text  # its cwd: the submit folder
    reports = project / "reports" / f"slurm-{job_id}"
    assert (reports / "bootstrap.json").is_file() and (reports / "verify-n1.json").is_file(), text
    assert set((REPO / "reports").glob("slurm-*")) == before  # nothing in the checkout
    row = next(
        r for r in json.loads((reports / "verify-n1.json").read_text())["results"] if r["id"] == "verify-command"
    )
    assert row["status"] == "ok", row


def test_the_hook_judges_a_node_without_gpus_as_a_cpu_node(slurm: Cluster, tmp_path: Path) -> None:
    """``bootstrap --hook --drain`` live on n2 (no GPU, no driver, no gpu in its Gres): healthy, nothing drained;
    with ``--expect-gpus 1`` the same node is a GPU node with no GPU on its bus (fallen off, or never seated), and
    drains for that: no NVIDIA device on the bus makes the driver row a skip, so ``node-gpus`` is the reason."""
    argv = [sys.executable, "-m", "invoke", "-r", str(REPO), "bootstrap", "--hook", "--drain"]
    env = slurm.env(SLURMD_NODENAME="n2", HOME=str(tmp_path))
    try:
        cpu = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert cpu.returncode == 0 and cpu.stderr == "", cpu.stderr
        assert _state(slurm, "n2")[0] == "idle"
        gpu = subprocess.run([*argv, "--expect-gpus", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert gpu.returncode == 1, gpu.stderr
        assert gpu.stderr.startswith("gpu-preflight: node-gpus 0 GPU(s) visible, 1 expected"), gpu.stderr
        flags, reason = _state(slurm, "n2")
        assert flags.startswith("drain") and reason.startswith("gpu-preflight: node-gpus"), (flags, reason)
    finally:
        _resume(slurm, "n2")


def test_the_hinted_drain_is_accepted_in_a_job(slurm: Cluster, tmp_path: Path) -> None:
    """``srun invoke bootstrap`` hints "run again with --drain"; that command runs, and drains the failing nodes
    (a /dev/shm floor neither n1 nor n2 meets, planted) with gpu-preflight's reason."""
    out = tmp_path / "job.json"
    argv = ["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "invoke", "-r", str(REPO), "bootstrap",
            "--no-bench", "--drain", "--json", str(out)]  # fmt: skip
    env = slurm.env(MASTER_ADDR="127.0.0.1", INVOKE_PREFLIGHT_HOST_SHM_MIN_MIB=SHM_NO_NODE_HAS, **_quick(tmp_path))
    try:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        said = done.stdout + done.stderr
        assert done.returncode == 1, said[-3000:]  # the nodes fail their shm check: not a usage error (2)
        assert "run again with --drain" in said, said[-3000:]
        for node in ("n1", "n2"):
            flags, reason = _state(slurm, node)
            # drng (draining) while the job's last task still ends there, drain after
            assert flags in ("drng", "drain") and reason.startswith("gpu-preflight: "), (node, flags, reason)
            assert "gpu-preflight: driver" not in reason, (node, reason)  # no NVIDIA device here: no driver fault
            assert f"drained {node}" in said, said[-3000:]
    finally:
        slurm.cancel_all()
        _resume(slurm, "n1", "n2")


def test_a_rendezvous_address_that_does_not_resolve_fails_within_a_minute(slurm: Cluster, tmp_path: Path) -> None:
    """``MASTER_ADDR=n0.invalid srun -N2 invoke bootstrap`` (RFC 2606: .invalid never resolves): every task stops
    within a minute with one line naming the address and the fix, instead of waiting on the store."""
    argv = ["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "invoke", "-r", str(REPO), "bootstrap"]
    env = slurm.env(MASTER_ADDR="n0.invalid", **_quick(tmp_path))
    began = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    finally:
        slurm.cancel_all()
    took = time.monotonic() - began
    errors = [line for line in done.stderr.splitlines() if "n0.invalid" in line]
    assert took < 60 and done.returncode != 0, (took, done.stderr[-2000:])
    assert len(errors) == 2 and all("MASTER_ADDR" in line for line in errors), done.stderr[-2000:]
