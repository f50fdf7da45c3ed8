"""A real two-node Slurm cluster on this box for the tests: Debian's munged, slurmctld and two slurmd.

``cluster(root)`` writes a minimal ``slurm.conf`` under ``root`` (no accounting, ``proctrack/linuxproc``,
``task/none``, spool and state under ``root``, free ports), starts ``munged`` with a key and socket of its own,
``slurmctld -D -i`` and ``slurmd -D -N n1`` / ``-N n2`` (one ``NodeName`` line each, ``NodeAddr=127.0.0.1`` and a
port of its own), waits until ``sinfo`` shows both idle, and stops every daemon by PID when the block ends (also when
it fails). ``nofile`` sets a node's open-files limit (soft and hard: slurmd raises its soft limit to the hard one), which slurmd passes on to its tasks: a real fault that
bootstrap's ulimits check catches on that node alone (PropagateResourceLimits=NONE: a task gets its slurmd's limits, not srun's). ``unavailable()`` says why the cluster cannot run here
(not root, or the packages missing: ``.ci/run`` installs them).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from checks.probe.tcp import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scontrol")


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (munged, slurmd)"
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    return f"Slurm is not installed here (missing {', '.join(missing)}): .ci/run installs it" if missing else None


def _free_ports(n: int) -> list[int]:
    """``n`` ports in a row, free, below the ephemeral range: slurmd retries slurmctld's port until it listens
    (a retried port inside that range can connect to itself: ``checks.probe.tcp.free_port``)."""
    base = free_port("127.0.0.1", span=n)
    return [base + k for k in range(n)]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Cluster:
    root: Path
    conf: Path
    procs: list[subprocess.Popen[bytes]]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user's shell on this cluster has: SLURM_CONF, no job variables of a caller."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC", "MASTER_"))}
        return env | {"SLURM_CONF": str(self.conf)} | extra

    def cancel_all(self, wait_s: float = 20) -> None:
        """Cancel every job of the cluster and wait until its steps are gone (slurmstepd runs in sessions of its
        own: stopping slurmd would leave them and the job's processes running)."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            jobs = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
            if jobs:
                self.run("scancel", "--full", "--signal=KILL", *jobs, timeout=10)
                self._gone(wait_s)

    def batch(self, argv: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 300) -> str:
        """``sbatch --parsable ARGV``, waited for until the job has left the queue (cancelled either way); its id."""
        try:
            done = subprocess.run(["sbatch", "--parsable", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=60)  # fmt: skip
            assert done.returncode == 0, done.stderr
            job_id = done.stdout.strip().split(";")[0]
            assert self.wait_job(job_id, timeout=timeout), f"job {job_id} still queued after {timeout:g} s"
        finally:
            self.cancel_all()
        return job_id

    def wait_job(self, job_id: str, timeout: float) -> bool:
        """Wait until ``job_id`` has left the queue; False on timeout. (``sbatch --wait`` polls at intervals that
        grow to 10 s: it noticed a job done at 29 s only at 42 s.)"""
        return self._gone(timeout, "-j", job_id)

    def _gone(self, timeout: float, *which: str) -> bool:
        """Poll squeue every 0.3 s until it lists none of ``which`` (every job when empty); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", *which, timeout=10).stdout.strip():
                return True
            time.sleep(0.3)
        return False

    def run(self, *argv: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


CONF = """ClusterName=preflight{tag}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
PropagateResourceLimits=NONE
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeAddr=127.0.0.1 Port={d1} CPUs=1 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 Port={d2} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def cluster(root: Path, nofile: dict[str, int] | None = None) -> Iterator[Cluster]:
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    ctld, d1, d2 = _free_ports(3)
    conf = root / "slurm.conf"
    conf.write_text(CONF.format(root=root, ctld=ctld, d1=d1, d2=d2, tag=os.getpid()), encoding="utf-8")
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n", encoding="utf-8")
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    made = Cluster(root, conf, [])
    env = made.env()

    def start(argv: list[str], log: str, limit: int | None = None) -> None:
        def lower() -> None:
            # No core files: a task that aborts (a gloo peer whose node was killed) would leave one in the
            # checkout, where srun starts it, since slurmd raises its soft limits to the hard ones.
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))  # slurmd raises its soft limit to the hard

        with (root / log).open("wb") as out:
            made.procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               preexec_fn=lower, start_new_session=True))  # fmt: skip

    try:
        start([_binary("munged"), "--foreground", "--force", f"--socket={root}/munge.socket", f"--key-file={key}",
               f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"],
              "munged.out")  # fmt: skip
        _wait(lambda: (root / "munge.socket").exists(), 10, "munged did not create its socket", root)
        start([_binary("slurmctld"), "-D", "-i", "-f", str(conf)], "slurmctld.out")
        for node in ("n1", "n2"):
            start(
                [_binary("slurmd"), "-D", "-N", node, "-f", str(conf)], f"slurmd-{node}.out", (nofile or {}).get(node)
            )

        def idle() -> bool:
            done = made.run("sinfo", "-h", "-o", "%n %t", timeout=10)
            states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
            return states.get("n1") == "idle" and states.get("n2") == "idle"

        _wait(idle, 45, "the two slurmd did not come up idle in sinfo", root)
        yield made
    finally:
        made.cancel_all()
        for proc in reversed(made.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(made.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait(ready: object, seconds: float, message: str, root: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(root.glob("*.out")))
    raise RuntimeError(f"{message}\n{logs}")
