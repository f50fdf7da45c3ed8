"""bootstrap started on every node of a job by the engine, as srun starts it: one process per
node with Slurm's task variables, the nodes' records exchanged through torch's TCPStore, the fleet report on rank 0.

Real processes (``python -m invoke bootstrap``), each running this machine's checks, on loopback. The node names
come from ``SLURMD_NODENAME`` as srun sets them; the fault is real: n2's task runs with a soft open-files limit of
1024 (as a slurmd started with a low limit passes it on), which the ulimits check catches on n2 alone.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from checks.probe.tcp import free_port

pytestmark = pytest.mark.slow  # each node is a real bootstrap process

REPO = Path(__file__).resolve().parents[3]


def _low_nofile() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def _srun(tmp_path: Path, tasks: int, started: tuple[int, ...]) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """srun's task variables for ``tasks`` tasks on nodes n1..nN, one a node; only the ranks in ``started`` run
    (a node that never starts its task is one the job lists but never hears from). Rank 1 runs with a soft
    open-files limit of 1024."""
    port = free_port("127.0.0.1", span=2)  # the exchange takes MASTER_PORT + 1
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "MASTER_", "INVOKE_"))}
    base |= {"SLURM_NTASKS": str(tasks), "SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": f"n[1-{tasks}]"}
    base |= {"SLURM_STEP_TASKS_PER_NODE": f"1(x{tasks})", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    base |= {"SLURM_LOCALID": "0", "INVOKE_PREFLIGHT_HOSTS_JOB_WAIT_S": "8", "HOME": str(tmp_path)}
    base |= {"XDG_CACHE_HOME": str(tmp_path / "c"), "INVOKE_PREFLIGHT_NETWORK_ALLREDUCE_BUDGET_S": "2"}
    procs = []
    for rank in started:
        env = base | {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank), "SLURMD_NODENAME": f"n{rank + 1}"}
        argv = [sys.executable, "-m", "invoke", "bootstrap", "--json", str(tmp_path / f"rank{rank}.json")]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=_low_nofile if rank == 1 else None))  # fmt: skip
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return procs, outputs


def _rows(path: Path) -> dict[tuple[str | None, str], dict]:
    return {(r["host"], r["id"]): r for r in json.loads(path.read_text(encoding="utf-8"))["results"]}


def test_srun_tasks_gather_one_record_per_node_and_a_silent_node_is_a_fail_row(tmp_path: Path) -> None:
    """n1 and n2 run and report by their Slurm names; n3 is in the step's node list but never starts, so rank 0 names
    it after its wait instead of hanging, and skips the all-reduce that needs every process (the all-reduce itself
    runs in tests/checks/fleet/test_slurm.py, on a real cluster)."""
    procs, outputs = _srun(tmp_path, 3, (0, 1))
    assert procs[1].returncode == 0 and not (tmp_path / "rank1.json").exists(), outputs[1]  # rank 0 reports the job
    assert procs[0].returncode == 1, outputs[0]
    rows = _rows(tmp_path / "rank0.json")
    assert rows["n1", "host-bootstrap"]["status"] == "ok" and rows["n2", "host-bootstrap"]["status"] == "ok"
    assert rows["n2", "ulimits"]["value"]["nofile"] == 1024 and rows["n1", "ulimits"]["value"]["nofile"] != 1024
    assert rows["n3", "host-bootstrap"]["status"] == "fail"
    assert rows["n3", "host-bootstrap"]["summary"].startswith("n3: no result from n3 within 8 s")
    assert "slurm job 4242" in outputs[0] and "all-reduce: skipped: a node did not report" in outputs[0]
