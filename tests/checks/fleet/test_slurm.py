"""gpu-preflight on a real Slurm cluster: Debian's munged, slurmctld and two slurmd n1/n2 on this box
(tests/slurmcluster.py). n2's slurmd runs with an open-files limit of 1024, which its tasks inherit: a real
fault, caught by bootstrap's ulimits check on n2 alone. Skipped with the reason where not root or not installed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.probe.tcp import free_port
from tests.slurmcluster import Cluster, cluster, unavailable
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "tests" / "checks" / "verify" / "user" / "scripts"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("slurm"), nofile={"n2": 1024}) as made:
        yield made


SHM_NO_NODE_HAS = str(1 << 30)  # MiB: a /dev/shm floor of 1 PiB, a planted failure of every node


def _quick(tmp: Path) -> dict[str, str]:
    """A home of the test's own, and short sweeps: what a user's environment passes to srun (--export=ALL)."""
    return {"HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache"), "INVOKE_PREFLIGHT_NETWORK_ALLREDUCE_BUDGET_S": "2",
            "INVOKE_PREFLIGHT_HOSTS_JOB_WAIT_S": "60", "INVOKE_PREFLIGHT_NETWORK_LINK_SECONDS": "1"}  # fmt: skip


def test_the_sbatch_template_runs_bootstrap_and_the_users_ddp_across_both_nodes(slurm: Cluster, tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "job.sbatch"
    made = subprocess.run(
        [sys.executable, "-m", "invoke", "sbatch", "--nodes", "2", "--gpus-per-node", "0", "--time", "10",
         "--out", str(script), "--", sys.executable, str(SCRIPTS / "ddp_gloo.py")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # A /dev/shm floor no node meets: a failure on both nodes, so both get their drain command (the box has no
    # NVIDIA device on its bus, so the missing driver is no failure here).
    env = slurm.env(**_quick(tmp_path), INVOKE_PREFLIGHT_VERIFY_STEPS="4", INVOKE_PREFLIGHT_VERIFY_WARMUP="2",
                    INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S="0", INVOKE_PREFLIGHT_HOST_SHM_MIN_MIB=SHM_NO_NODE_HAS)  # fmt: skip
    job_id = slurm.batch(["--chdir", str(tmp_path), str(script)], env)
    log = tmp_path / f"gpu-preflight-{job_id}.out"
    text = log.read_text(encoding="utf-8") if log.exists() else "(no log)"
    reports = tmp_path / "reports" / f"slurm-{job_id}"  # beside the project: the folder the job ran in (--chdir)
    try:
        # Step 1 is `srun --ntasks-per-node=1 python -m invoke bootstrap`, as a user runs it by hand: both nodes
        # report by their Slurm names, n2's low open-files limit is caught on n2 alone, the nodes meet for the
        # all-reduce and the pairwise link pass, and the nodes that failed get their drain command.
        boot = json.loads((reports / "bootstrap.json").read_text(encoding="utf-8"))
        rows = {(r["host"], r["id"]): r for r in boot["results"]}
        assert rows["n1", "host-bootstrap"]["status"] == "ok" and rows["n2", "host-bootstrap"]["status"] == "ok", text
        assert rows["n2", "ulimits"]["value"]["nofile"] == 1024 and rows["n1", "ulimits"]["value"]["nofile"] != 1024
        assert rows[None, "net-allreduce"]["summary"].startswith("gloo, 2 ranks"), text
        # The pairwise pass: n2 measured both directions against n1's agent, with the same test as bootstrap --hosts.
        links = boot["measurements"]["links"]
        assert {(x["src"], x["dst"]) for x in links} == {("n1", "n2"), ("n2", "n1")}, links
        assert all(x["error"] is None and x["tcp_mbit_s"] > 100 and x["rtt_ms"] is not None for x in links), links
        # Both nodes fail the planted /dev/shm floor, so both get their drain command.
        assert "scontrol update NodeName=n1 State=DRAIN Reason='gpu-preflight: shm" in text, text
        assert "srun --exclude=n[1-2]" in text, text
        # Step 2: the user's command under torchrun on each node (its node flags set per node, rendezvous on n1):
        # n1 (node 0) gathers both nodes' runs and writes the one report, with the job's two ranks, one a node.
        m = json.loads((reports / "verify-n1.json").read_text(encoding="utf-8"))["measurements"]
        assert m["command"]["ended"] == "stopped" and m["step_time"]["steps"] == 4, text
        assert m["command"]["processes_left"] == [] and m["command"]["steps_seen"] == {"0": 6, "1": 6}, m["command"]
        assert [h["host"] for h in m["ddp"]["hosts"]] == ["n1", "n2"] and [h["ranks"] for h in m["ddp"]["hosts"]] == [
            [0],
            [1],
        ]
        assert not (reports / "verify-n2.json").exists(), text
    finally:
        import shutil

        shutil.rmtree(reports, ignore_errors=True)


def _srun_verify(
    slurm: Cluster, tmp_path: Path, *args: str, **extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``srun -N2 --ntasks-per-node=1 invoke verify --json verify-NODE.json ARGS`` with a short run: what each task
    said, and the wall time of srun."""
    verify = (
        f'echo SLURM_JOB_ID $SLURM_JOB_ID; exec "{sys.executable}" -m invoke verify '
        f'--json "{tmp_path}/verify-$SLURMD_NODENAME.json" {shlex.join(args)}'
    )
    # A port of the test's own: the port from the job id is the same for another test cluster's job on this box.
    env = slurm.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1", span=2)), **_quick(tmp_path), INVOKE_PREFLIGHT_VERIFY_STEPS="4",
                    INVOKE_PREFLIGHT_VERIFY_WARMUP="2",
                    # What is asserted is the run's shape, not its data: small images, no advice re-runs.
                    INVOKE_PREFLIGHT_VERIFY_IMAGE_SIZE="16", INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S="0", **extra)  # fmt: skip
    began = time.monotonic()
    try:
        done = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", verify], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        slurm.cancel_all()
    return done, time.monotonic() - began


def test_srun_verify_trains_one_ddp_run_across_both_nodes(slurm: Cluster, tmp_path: Path) -> None:
    """``srun -N2 --ntasks-per-node=1 invoke verify``: each task runs its node's part of one torchrun job of the
    tool's script (rendezvous on the job's first node), and n1 (node 0) gathers both nodes' runs and writes the one
    report with every rank; n2 says where it is and writes none."""
    done, seconds = _srun_verify(slurm, tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "verify: n1: node 0 of 2 in the slurm job" in said and "verify: n2: node 1 of 2" in said, said[-3000:]
    assert "verify: n2: this node's ranks ended (exited); the job's report is written on n1" in said, said[-3000:]
    assert not (tmp_path / "verify-n2.json").exists()  # one report for the job, on node 0
    doc = json.loads((tmp_path / "verify-n1.json").read_text(encoding="utf-8"))
    rows, m = {r["id"]: r for r in doc["results"]}, doc["measurements"]
    assert rows["verify-hosts"]["status"] == "ok" and "n1 rank 0, n2 rank 1" in rows["verify-hosts"]["summary"]
    assert rows["verify-command"]["status"] == "ok" and "--nnodes=2" in rows["verify-command"]["summary"], rows
    assert m["command"]["ended"] == "exited" and m["command"]["steps_seen"] == {"0": 6, "1": 6}  # warm-up 2 + 4
    ddp = m["ddp"]
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo", ddp
    assert [h["host"] for h in ddp["hosts"]] == ["n1", "n2"] and [h["ranks"] for h in ddp["hosts"]] == [[0], [1]]
    assert [r["rank"] for r in ddp["per_rank"]] == [0, 1], ddp["per_rank"]  # every rank of both nodes, judged on n1
    assert ddp["grad_bytes"] and ddp["comm_exposed_ms"] is not None, ddp
    assert [r["rank"] for r in m["per_rank"]] == [0, 1]
    assert all(r["steps"] == 4 and r["median_s"] for r in m["per_rank"]), m["per_rank"]
    job = next(line.split()[-1] for line in said.splitlines() if "SLURM_JOB_ID " in line)
    assert _job_processes(job, slurm.conf) == []  # no rank, torchrun agent or DataLoader worker of the job is left
    print(f"srun -N2 invoke verify: {seconds:.1f} s")


def test_srun_verify_of_a_users_torchrun_command_runs_it_across_both_nodes(slurm: Cluster, tmp_path: Path) -> None:
    """``srun -N2 --ntasks-per-node=1 invoke verify -- torchrun --standalone --nproc-per-node=3 ddp_gloo.py``:
    torchrun's node flags are set per node (one gloo rank each, rendezvous on n1), each node's ranks are stopped
    after warm-up + steps, and n1's one report holds both nodes' ranks."""
    done, _ = _srun_verify(slurm, tmp_path, "--", "torchrun", "--standalone", "--nproc-per-node=3", str(SCRIPTS / "ddp_gloo.py"))  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    doc = json.loads((tmp_path / "verify-n1.json").read_text(encoding="utf-8"))
    rows, m = {r["id"]: r for r in doc["results"]}, doc["measurements"]
    assert rows["verify-command"]["status"] == "ok", rows["verify-command"]
    assert m["command"]["ended"] == "stopped" and m["command"]["steps_seen"] == {"0": 6, "1": 6}, m["command"]
    assert [h["ranks"] for h in m["ddp"]["hosts"]] == [[0], [1]]  # one rank a node (gloo), not the 3 it asked for
    assert [r["rank"] for r in m["per_rank"]] == [0, 1]
    assert not (tmp_path / "verify-n2.json").exists()
    job = next(line.split()[-1] for line in said.splitlines() if "SLURM_JOB_ID " in line)
    assert _job_processes(job, slurm.conf) == []


def test_srun_verify_with_a_rendezvous_address_that_does_not_resolve_fails_within_a_minute(
    slurm: Cluster, tmp_path: Path
) -> None:
    """``MASTER_ADDR=n0.invalid srun -N2 invoke verify``: every task stops before torchrun starts, with one line
    naming the address and the fix (as bootstrap does: test_slurm_admin.py), instead of waiting on the rendezvous."""
    argv = ["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "invoke", "verify"]
    began = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=REPO, env=slurm.env(MASTER_ADDR="n0.invalid", **_quick(tmp_path)),
                              capture_output=True, text=True, timeout=90)  # fmt: skip
    finally:
        slurm.cancel_all()
    took = time.monotonic() - began
    errors = [line for line in done.stderr.splitlines() if "n0.invalid" in line]
    assert took < 60 and done.returncode == 2, (took, done.stderr[-2000:])
    assert len(errors) == 2 and all("does not resolve" in line and "MASTER_ADDR" in line for line in errors), errors


def test_hook_drain_and_resume_against_the_real_slurmctld(slurm: Cluster, tmp_path: Path) -> None:
    """bootstrap --hook --drain as Slurm runs it on n2 (a HealthCheckProgram or Prolog: SLURMD_NODENAME set): an
    unhealthy machine drains n2 with gpu-preflight's reason, a healthy one resumes it (the reason is ours); a node
    drained by someone else stays drained. The machines are recorded snapshots; scontrol and slurmctld are real."""
    import subprocess

    machines = REPO / "tests" / "fixtures" / "machines"

    def hook(snapshot: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "invoke", "bootstrap", "--hook", "--drain", "--machine", str(machines / snapshot)]
        env = slurm.env(SLURMD_NODENAME="n2", HOME=str(tmp_path))
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    def state() -> tuple[str, str]:
        line = slurm.run("sinfo", "-n", "n2", "-h", "-o", "%t|%E").stdout.strip()
        flags, _, reason = line.partition("|")
        return flags.rstrip("*~#!%$@^-"), reason  # sinfo's suffixes (* not responding yet, ...) are not the state

    try:
        sick = hook("gpu-lost.json")
        assert sick.returncode == 1 and sick.stderr.startswith("gpu-preflight: "), sick.stderr
        flags, reason = state()
        assert flags.startswith("drain") and reason.startswith("gpu-preflight: gpu-inventory"), (flags, reason)
        well = hook("h100-sxm-8x-healthy.json")
        assert well.returncode == 0, well.stderr
        assert state()[0] == "idle"
        slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=maintenance by the operator")
        assert hook("h100-sxm-8x-healthy.json").returncode == 0
        assert state() == ("drain", "maintenance by the operator")  # not ours: a healthy run leaves it drained
    finally:
        slurm.run("scontrol", "update", "NodeName=n2", "State=RESUME")


def _job_processes(job_id: str, conf: Path | None = None) -> list[tuple[int, str, str]]:
    """(pid, SLURM_PROCID, command line) of every process of this Slurm job on the box, read from /proc; with
    ``conf``, of this cluster's job only (another test cluster on the box numbers its jobs alike)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(v.split("=", 1) for v in (proc / "environ").read_text(errors="replace").split("\0") if "=" in v)
            cmd = (proc / "cmdline").read_text(errors="replace").replace("\0", " ")
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job_id and (conf is None or env.get("SLURM_CONF") == str(conf)):
            found.append((int(proc.name), env.get("SLURM_PROCID", ""), cmd))
    return found


def test_a_node_killed_mid_run_is_named_and_nothing_is_left_running(slurm: Cluster, tmp_path: Path) -> None:
    """srun -N2 bootstrap; n2's task is killed (SIGKILL) while it runs its checks: rank 0 names n2 after
    hosts.job_wait_s instead of hanging, and when srun returns no process of the job is left on the box."""
    import os
    import signal
    import subprocess

    out = tmp_path / "job.json"
    argv = ["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "invoke", "bootstrap", "--json", str(out)]
    env = slurm.env(MASTER_ADDR="127.0.0.1", **(_quick(tmp_path) | {"INVOKE_PREFLIGHT_HOSTS_JOB_WAIT_S": "4"}))
    srun = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job_id = ""

    def n2_task() -> int | None:
        nonlocal job_id
        jobs = slurm.run("squeue", "-h", "-o", "%i").stdout.split()
        job_id = jobs[0] if jobs else ""
        return next((pid for pid, rank, cmd in _job_processes(job_id) if rank == "1" and "bootstrap" in cmd), None)

    try:
        victim = until(n2_task, 60, what="n2's bootstrap task")
        os.kill(victim, signal.SIGKILL)
        output = srun.communicate(timeout=180)[0]
    finally:
        if srun.poll() is None:
            srun.kill()
        slurm.cancel_all()
    rows = {(r["host"], r["id"]): r for r in json.loads(out.read_text(encoding="utf-8"))["results"]}
    assert rows["n1", "host-bootstrap"]["status"] == "ok", output
    assert rows["n2", "host-bootstrap"]["summary"].startswith("n2: no result from n2 within 4 s"), output
    assert _job_processes(job_id) == [], _job_processes(job_id)
