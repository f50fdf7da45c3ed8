"""``invoke verify --hosts`` against real hosts: two network namespaces with sshd, joined by a 200 Mbit/s link.

The hosts are tests/netns.py's (tc-shaped veths, real sshd, the checkout shipped by rsync); each runs its rank
with gloo, as one torchrun job across them (the tool's script templates/train.py under the agent, judged by the
command path: checks/verify/hosts.py). The model is one wide Linear layer (~4.7M parameters, 18.9 MB of fp32 gradients) importable on the
hosts from a folder on their Python path, as a user's own module would be: across the 200 Mbit/s link its
all-reduce (~0.76 s on the wire) costs more than the step's math and the run must come out ``comm-bound``; the
same model as two ranks on one box (``--nproc 2``, gloo over loopback) must expose a fraction of that time
(whether that fraction clears share_warn depends on the box: see its test). The link is no slower than that
verdict needs: every step of the hosts' run, and the checkpoint copied to the second host, pays for it on the
wire. (Half the width instead would halve the wire time too, but not the one-box run's exposed exchange: gloo's
fixed cost per step over loopback, ~40 ms on the 2 shared cores, then weighs twice as much against half the math.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checks.verify.events import StepLine, parse_line
from tests.netns import Cluster, cluster, controller_env, python_for_hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REPO = Path(__file__).resolve().parents[3]
RATE_MBIT = 200
HIDDEN = 6144  # Linear(768 -> 6144) + Linear(6144 -> 4): 4,743,172 parameters
PARAMS = 768 * HIDDEN + HIDDEN + HIDDEN * 4 + 4
BATCH = 256  # the hosts' runs: the link's 0.76 s per step outweighs the math (~0.1 s on the 2 shared cores)
PLUGIN = '''
import numpy as np


class Quadrants:
    """16 x 16 x 3 images, class i % 4 as a bright quadrant."""

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        img = np.random.default_rng(int(i)).integers(0, 64, (16, 16, 3), dtype=np.uint8)
        r, c = divmod(int(i) % 4, 2)
        img[r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] += 150
        return img, int(i) % 4


def quadrants():
    return Quadrants()


def wide_linear():
    import torch
    from torch import nn

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Linear(768, HIDDEN)
            self.out = nn.Linear(HIDDEN, 4)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x.flatten(1).float() / 255)))

    return Wide()


def narrow_linear():
    import torch
    from torch import nn

    class Narrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Linear(768, 64)
            self.out = nn.Linear(64, 4)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x.flatten(1).float() / 255)))

    return Narrow()


def crash_on_second_host():
    """Rank 1 (the second host's) raises on its 3rd forward, in the warm-up or the measured steps (a narrow
    model: what is tested is the failure's way back, not the exchange)."""
    import torch.distributed as dist

    model = narrow_linear()
    calls = []

    def boom(module, args):
        calls.append(1)
        if dist.get_rank() == 1 and len(calls) == 3:
            raise RuntimeError("planted failure on rank 1")

    model.register_forward_pre_hook(boom)
    return model
'''.replace("HIDDEN)", f"{HIDDEN})").replace("(HIDDEN,", f"({HIDDEN},")
# No re-runs (command_advice_s 0): across hosts none run; the one-box run's comm hook figure is what its test reads
# (with them, its loader, one-process and exchange A/B re-runs took it from about 20 s to 102 s, holding the box).
CONFIG = """preflight:
  verify: {{steps: 4, warmup: 1, image_size: 16, command_advice_s: 0.0,
            sample_interval_s: 0.2, stall_timeout_s: 120.0, timeout_s: 300.0}}
  hosts: {{python: {python}, connect_timeout_s: 3.0, dead_after_s: 5.0, run_timeout_s: 300.0}}
"""


@dataclass
class Controller:
    """The machine `invoke verify --hosts` runs on: its HOME, ssh config, run config and the user's module."""

    cluster: Cluster
    home: Path

    def env(self) -> dict[str, str]:
        return controller_env(self.home) | {"PYTHONPATH": str(self.home / "plugins")}

    def verify(
        self, *args: str, timeout: float = 420, batch: int = BATCH
    ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        report = self.home / f"verify-{time.monotonic_ns()}.json"
        argv = [sys.executable, "-m", "invoke", "-f", str(self.home / "run.yaml"), "verify", "--workers", "0"]
        argv += ["--batch-size", str(batch), "--json", str(report), "--dataset", "userplugin:quadrants", *args]
        proc = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout)
        return proc, json.loads(report.read_text()) if report.exists() else {}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    root = tmp_path_factory.mktemp("verify-hosts")
    with cluster(root / "hosts", [RATE_MBIT, RATE_MBIT]) as built:
        home = root / "controller"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(built.ssh_config())
        (home / "plugins").mkdir()
        (home / "plugins" / "userplugin.py").write_text(PLUGIN)
        # The hosts' Python finds the user's module on its path, as it would where the user installed it. The hosts
        # share this box's 2 cores, which real hosts do not: their ranks' OpenMP threads wait passively, as the
        # suite's own children do (tests/conftest.py).
        python = home / "python-with-plugins"
        python.write_text(
            f'#!/bin/sh\nOMP_WAIT_POLICY=PASSIVE PYTHONPATH={home / "plugins"} exec {python_for_hosts()} "$@"\n'
        )
        python.chmod(0o755)
        (home / "run.yaml").write_text(CONFIG.format(python=python))
        yield Controller(built, home)


@pytest.mark.measures
def test_the_same_model_as_two_ranks_on_one_box_exposes_a_fraction_of_the_links_exchange(ctl: Controller) -> None:
    # First in the module: right after a --hosts run this 2-core box was seen busy for a while, which is not what
    # this test compares. Whether the one-box share clears share_warn depends on the box, not on the tool: with
    # 4,096 samples a step it was 4% here and 19% on a CI box of the same size that was cpu-starved too (the ranks
    # build their batches in-process, and a rank late from its own batch is waited for at the all-reduce); with
    # these 1,024, 5% here (13% while the ranks' OpenMP threads spun, before tests/conftest.py made them wait
    # passively). So the verdict is not asserted: the exchange's time against the link's is.
    proc, report = ctl.verify("--nproc", "2", "--model", "userplugin:wide_linear", batch=4 * BATCH)
    assert report, proc.stderr[-3000:]
    ddp = report["measurements"]["ddp"]
    assert abs(ddp["grad_bytes"] / (4 * PARAMS) - 1) < 0.05 and "hosts" not in ddp
    wire_s = ddp["grad_bytes"] / (RATE_MBIT * 1e6 / 8)  # what the same bytes take over the hosts' link
    # 20 ms here against 0.76 s on the wire; the bound is what 100 Mbit/s would take with no overlap at all.
    assert ddp["comm_exposed_ms"] / 1000 < 0.5 * wire_s, (ddp["comm_exposed_ms"], wire_s)
    comm = [v for v in report["measurements"]["diagnosis"]["verdicts"] if v["id"] == "comm-bound"]
    assert all("hosts" not in v["summary"] and "link_mbit_s" not in v["evidence"] for v in comm), comm


@pytest.fixture(scope="module")
def across(ctl: Controller) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
    start = time.monotonic()
    proc, report = ctl.verify("--hosts", "h1,h2", "--model", "userplugin:wide_linear")
    return proc, report, time.monotonic() - start


def _by_id(report: dict[str, Any]) -> dict[str, Any]:
    return {r["id"]: r for r in report["results"]}


@pytest.mark.measures
def test_two_hosts_on_200_mbit_are_comm_bound_with_the_gradient_bytes_and_the_link(across: Any) -> None:
    proc, report, seconds = across
    assert report, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = _by_id(report)
    assert rows["verify-hosts"]["status"] == "ok" and "h1 rank 0, h2 rank 1" in rows["verify-hosts"]["summary"]
    assert "not run across hosts" in rows["verify-hosts"]["summary"]
    assert rows["verify-command"]["status"] == "ok" and "torchrun --nnodes=2" in rows["verify-command"]["summary"]
    m = report["measurements"]
    assert m["command"]["ended"] == "exited" and m["command"]["steps_seen"] == {"0": 5, "1": 5}  # warm-up 1 + 4
    ddp = m["ddp"]
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo"
    assert [h["host"] for h in ddp["hosts"]] == ["h1", "h2"] and [h["ranks"] for h in ddp["hosts"]] == [[0], [1]]
    assert abs(ddp["grad_bytes"] / (4 * PARAMS) - 1) < 0.05, ddp["grad_bytes"]
    # One rank per host: each sends grad_bytes x 2(n-1)/n = grad_bytes through its 200 Mbit/s link per step.
    wire_s = ddp["grad_bytes"] / (RATE_MBIT * 1e6 / 8)
    assert 0.75 <= ddp["comm_exposed_ms"] / 1000 / wire_s <= 1.6, (ddp["comm_exposed_ms"], wire_s)
    assert 0.5 * RATE_MBIT <= ddp["link_mbit_s"] <= 1.1 * RATE_MBIT, ddp["link_mbit_s"]
    verdicts = {v["id"]: v for v in m["diagnosis"]["verdicts"]}
    assert "comm-bound" in verdicts, verdicts
    comm = verdicts["comm-bound"]  # the verdict says where the ranks waited, and what the link carried meanwhile
    assert "2 ranks (gloo) across 2 hosts wait" in comm["summary"] and "Mbit/s on the link" in comm["summary"], comm
    assert comm["evidence"]["link_mbit_s"] == ddp["link_mbit_s"] and len(comm["evidence"]["hosts"]) == 2
    # Every rank of both hosts, with its own figures: the exchange's rows and every process's breakdown.
    assert [r["rank"] for r in ddp["per_rank"]] == [0, 1] and all(r["own_s"] for r in ddp["per_rank"])
    assert [r["rank"] for r in m["per_rank"]] == [0, 1]
    assert all(r["steps"] == 4 and r["step_breakdown"] and r["median_s"] for r in m["per_rank"]), m["per_rank"]
    assert seconds < 400


def test_nothing_is_left_running_on_the_hosts(ctl: Controller, across: Any) -> None:
    time.sleep(1)
    assert _leftovers(ctl) == []
    for host in ctl.cluster.hosts:  # torch's own compile cache (torchinductor_<user>) stays, as after a local run
        left = [p.name for p in (host.root / "tmp").iterdir() if not p.name.startswith("torchinductor_")]
        assert left == [], host.name


USER_SCRIPT = """
import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100_000):  # trains until verify stops it
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_users_torchrun_command_runs_across_the_hosts_with_its_node_flags_set_per_host(ctl: Controller) -> None:
    script = ctl.home / "plugins" / "user_ddp.py"
    script.write_text(USER_SCRIPT)
    report = ctl.home / "user-command.json"
    argv = [sys.executable, "-m", "invoke", "-f", str(ctl.home / "run.yaml"), "verify", "--json", str(report)]
    argv += ["--hosts", "h1,h2", "--", "torchrun", "--standalone", "--nproc-per-node=3", str(script)]
    proc = subprocess.run(argv, cwd=REPO, env=ctl.env(), capture_output=True, text=True, timeout=300)
    doc = json.loads(report.read_text()) if report.exists() else {}
    assert doc, proc.stderr[-3000:]
    rows, m = _by_id(doc), doc["measurements"]
    assert rows["verify-command"]["status"] == "ok", rows["verify-command"]
    assert m["command"]["ended"] == "stopped" and m["command"]["steps_seen"] == {"0": 5, "1": 5}  # 1 + 4
    assert [h["ranks"] for h in m["ddp"]["hosts"]] == [[0], [1]]  # one rank a host (gloo), not the 3 it asked for
    assert [r["rank"] for r in m["per_rank"]] == [0, 1]
    time.sleep(1)
    assert _leftovers(ctl) == []


def test_a_command_that_is_not_torchrun_is_refused_across_hosts(ctl: Controller) -> None:
    argv = [sys.executable, "-m", "invoke", "-f", str(ctl.home / "run.yaml"), "verify", "--hosts", "h1,h2"]
    proc = subprocess.run([*argv, "--", "python", "train.py"], cwd=REPO, env=ctl.env(), capture_output=True, text=True)
    assert proc.returncode == 2 and "across hosts verify runs a torchrun command" in proc.stderr, proc.stderr


def test_a_rank_dying_on_one_host_stops_the_other_and_is_named(ctl: Controller) -> None:
    start = time.monotonic()
    proc, report = ctl.verify("--hosts", "h1,h2", "--model", "userplugin:crash_on_second_host", timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    command = _by_id(report)["verify-command"]
    assert command["status"] == "fail" and "planted failure" in command["summary"], command
    assert command["summary"].endswith("(rank 1 on h2)"), command
    assert time.monotonic() - start < 150
    time.sleep(1)
    assert _leftovers(ctl) == []


def test_an_unreachable_host_is_one_line_and_exit_2(ctl: Controller) -> None:
    ctl.cluster.stop_sshd(ctl.cluster.hosts[1])
    try:
        proc, report = ctl.verify("--hosts", "h1,h2", timeout=120)
    finally:
        ctl.cluster.start_sshd(ctl.cluster.hosts[1])
    assert proc.returncode == 2 and not report, proc.stderr[-2000:]
    assert "h2: unreachable: connection refused" in proc.stderr and "Traceback" not in proc.stderr
    assert _leftovers(ctl) == []


def test_ctrl_c_stops_every_hosts_ranks_writes_the_partial_report_and_exits_130(ctl: Controller) -> None:
    report = ctl.home / "interrupted.json"
    argv = [sys.executable, "-m", "invoke", "-f", str(ctl.home / "run.yaml"), "verify", "--workers", "0"]
    argv += ["--batch-size", "64", "--steps", "400", "--json", str(report), "--dataset", "userplugin:quadrants"]
    argv += ["--hosts", "h1,h2"]
    # A suite started from a background job inherits SIGINT ignored, and so would the controller: give it the
    # default, as a terminal's foreground process has, so that Python turns the signal into KeyboardInterrupt.
    proc = subprocess.Popen(
        argv, cwd=REPO, env=ctl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        measured = _measured_steps(ctl.cluster.hosts[0].root / "tmp", at_least=3, timeout=120)
        assert measured, "rank 0 never reached the measured steps on h1"
        proc.send_signal(signal.SIGINT)  # what a terminal sends to the foreground process
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "stopping every host's ranks" in err and "Traceback" not in err, err[-3000:]
    doc = json.loads(report.read_text())
    loop = _by_id(doc)["verify-loop"]
    assert loop["status"] == "warn" and loop["summary"].startswith("interrupted"), loop
    assert doc["measurements"]["command"]["ended"] == "interrupted"
    assert 3 <= doc["measurements"]["step_time"]["steps"] < 400
    assert set(doc["measurements"]["command"]["steps_seen"]) == {"0", "1"}
    time.sleep(1)
    assert _leftovers(ctl) == []
    for host in ctl.cluster.hosts:  # the run's temporary directories are gone from every host
        left = [p.name for p in (host.root / "tmp").iterdir() if not p.name.startswith("torchinductor_")]
        assert left == [], host.name


def _measured_steps(tmp: Path, at_least: int, timeout: float, warmup: int = 1) -> bool:
    """Wait until rank 0 (the agent's events files under its host's TMPDIR) logged measured steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A folder can vanish while the walk is in it (a probe's temporary working directory): look again.
        with contextlib.suppress(OSError, ValueError):  # and a line half written
            for events in tmp.rglob("events-*.jsonl"):
                lines = [parse_line(x) for x in events.read_text().splitlines() if x.endswith("}")]
                steps = [e for e in lines if isinstance(e, StepLine) and e.rank == 0]
                if len(steps) >= warmup + at_least:
                    return True
        time.sleep(0.2)
    return False


def _leftovers(ctl: Controller) -> list[str]:
    """Processes still running from the hosts' directories (their checkout or temp), sshd aside."""
    found = []
    for pid in ctl.cluster.processes_under(ctl.cluster.root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "sshd" not in cmd:
            found.append(cmd)
    return found
