"""bootstrap started on every node of a job by the engine (issue 19 part 2), as srun starts it: one process per
node with Slurm's task variables, the nodes' records exchanged through torch's TCPStore, the fleet report on rank 0.

Real processes (``python -m invoke bootstrap``), each running this machine's checks, on loopback. The node names
come from ``SLURMD_NODENAME`` as srun sets them; the fault is real: n2's task runs with a soft open-files limit of
1024 (as a slurmd started with a low limit passes it on), which the ulimits check catches on n2 alone.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each node is a real bootstrap process

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _low_nofile() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def test_srun_tasks_gather_one_record_per_node_named_as_slurm_names_them(tmp_path: Path) -> None:
    port, out = _free_port(), tmp_path / "job.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "MASTER_", "INVOKE_"))}
    base |= {"SLURM_NTASKS": "3", "SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "n[1-3]", "MASTER_PORT": str(port)}
    base |= {"SLURM_STEP_TASKS_PER_NODE": "1(x3)", "MASTER_ADDR": "127.0.0.1", "SLURM_LOCALID": "0"}
    base |= {"INVOKE_PREFLIGHT_HOSTS_JOB_WAIT_S": "8", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    procs = []
    for rank in (0, 1):  # n3 is in the step's node list but never starts: rank 0 must not hang on it
        env = base | {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank), "SLURMD_NODENAME": f"n{rank + 1}"}
        argv = [sys.executable, "-m", "invoke", "bootstrap", "--json", str(out if rank == 0 else tmp_path / "n2.json")]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=_low_nofile if rank == 1 else None))  # fmt: skip
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[1].returncode == 0 and not (tmp_path / "n2.json").exists(), outputs[1]  # rank 0 reports the job
    assert procs[0].returncode == 1, outputs[0]
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {(r["host"], r["id"]): r for r in report["results"]}
    assert rows["n1", "host-bootstrap"]["status"] == "ok" and rows["n2", "host-bootstrap"]["status"] == "ok"
    assert rows["n3", "host-bootstrap"]["status"] == "fail"
    assert rows["n3", "host-bootstrap"]["summary"].startswith("n3: no result from n3 within 8 s")
    assert rows["n2", "ulimits"]["value"]["nofile"] == 1024 and rows["n1", "ulimits"]["value"]["nofile"] != 1024
    assert "slurm job 4242" in outputs[0] and "n3: no result from n3" in outputs[0]
