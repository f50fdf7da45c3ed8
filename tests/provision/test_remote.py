"""``invoke bootstrap --hosts`` against real hosts: network namespaces with sshd, links shaped with tc.

One cluster for the module (tests/netns.py): h1 at 500 Mbit/s, h2-h4 at 2 Gbit/s, h5 unshaped. The
controller is this test process's namespace; its HOME is temporary and holds the ssh config that names the
hosts, the way a user's ~/.ssh/config would. Nothing but the test's own namespaces and loopback is touched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cli import default_sigint
from tests.netns import Cluster, cluster, controller_env, python_for_hosts, unavailable
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REPO = Path(__file__).resolve().parents[2]
RATES: list[int | None] = [500, 2000, 2000, 2000, None]
# link_omit_s 0: iperf3 omits whole seconds (checks/probe/iperf.py), so 0.5 cost a second per direction, 12 in the
# matrix, for TCP slow start that on these veths (RTT ~30 us) is over within milliseconds; tbf's burst is <1% of a
# second at 500 Mbit/s. allreduce_max_mib 4: busbw is level from 1 MiB on these links (0.066, 0.060, 0.060 GB/s
# at 1, 4, 16 MiB), and 16 MiB cost ~1.3 s more.
CONFIG = """preflight:
  bench: {{enabled: false}}
  disk: {{enabled: {disk}, budget_s: 30.0, max_file_mib: 4096, max_free_fraction: 0.2, use_fio: false}}
  network: {{link_seconds: 1.0, link_omit_s: 0.0, allreduce_max_mib: 4, allreduce_budget_s: 4.0,
             allreduce_timeout_s: 60.0}}
  hosts: {{python: {python}, connect_timeout_s: 3.0, dead_after_s: 3.0, run_timeout_s: 180.0}}
"""


@dataclass
class Controller:
    """The machine `invoke bootstrap --hosts` runs on: its HOME, ssh config and run config."""

    cluster: Cluster
    home: Path

    def env(self) -> dict[str, str]:
        return controller_env(self.home)

    def config(self, disk: bool = False) -> Path:
        path = self.home / f"run-{disk}.yaml"
        path.write_text(CONFIG.format(disk=str(disk).lower(), python=python_for_hosts()))
        return path

    def argv(self, *args: str, disk: bool = False) -> list[str]:
        return [sys.executable, "-m", "invoke", "-f", str(self.config(disk)), "bootstrap", *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    root = tmp_path_factory.mktemp("fleet")
    with cluster(root / "hosts", RATES) as built:
        home = root / "controller"
        (home / ".ssh").mkdir(parents=True)
        h3 = built.hosts[2]
        stranger = (f"Host h3-stranger\n  HostName {h3.address}\n  User root\n  IdentityFile {built.root / 'stranger_key'}\n"
                    "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")  # fmt: skip
        (home / ".ssh" / "config").write_text(built.ssh_config(stranger))
        yield Controller(built, home)


@pytest.fixture(scope="module")
def fleet(ctl: Controller) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
    """h1-h4 for real and h5 with its sshd stopped, in one run."""
    ctl.cluster.stop_sshd(ctl.cluster.hosts[4])
    start = time.monotonic()
    proc = ctl.run("--hosts", "h1,h2,h3,h4,h5", "--json", "-")
    return proc, json.loads(proc.stdout), time.monotonic() - start


@pytest.mark.measures
def test_bandwidth_matrix_matches_the_shaped_links(fleet: Any) -> None:
    # First of the fleet's tests: the run it reads is measured inside this measures test's lock (tests/conftest.py).
    _, doc, _ = fleet
    links = doc["measurements"]["links"]
    assert len(links) == 12 and all(x["error"] is None for x in links), links
    rate = dict(zip(["h1", "h2", "h3", "h4"], RATES, strict=False))
    for link in links:
        shaped = min(rate[link["src"]] or 10**6, rate[link["dst"]] or 10**6)
        # Never above the shaped rate (+10% for tc's burst); below it only by what the four hosts' other work
        # takes from this box's shared cores while they measure (0.96 of it when idle, BENCHMARKS.md).
        assert 0.75 <= link["tcp_mbit_s"] / shaped <= 1.10, link
        assert 0 < link["rtt_ms"] < 5
    outlier = [r for r in doc["results"] if r["id"] == "fleet-outlier"]
    assert [(r["host"], r["subject"]) for r in outlier] == [("h1", "links")], outlier


def test_every_live_host_reports_and_the_stopped_one_is_a_clean_fail_row(fleet: Any) -> None:
    proc, doc, _ = fleet
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert [hosts[f"h{i}"]["status"] for i in range(1, 6)] == ["ok"] * 4 + ["fail"]
    assert "connection refused" in hosts["h5"]["reason"] and hosts["h5"]["seconds"] < 10
    for name in ("h1", "h2", "h3", "h4"):
        own = [r for r in doc["results"] if r["host"] == name]
        assert {"host-bootstrap", "driver", "cpu-cores", "alloc-conf", "disk-speed"} <= {r["id"] for r in own}
        alloc = next(r for r in own if r["id"] == "alloc-conf")  # the hosts have no GPU: nothing written there
        assert alloc["status"] == "skip" and "nothing written" in alloc["summary"], alloc
    h5 = [r for r in doc["results"] if r["host"] == "h5"]
    assert [(r["id"], r["status"]) for r in h5] == [("host-bootstrap", "fail")]


@pytest.mark.measures  # the all-reduce's rate against a bound
def test_allreduce_runs_across_the_hosts_and_is_compared_with_the_link(fleet: Any) -> None:
    _, doc, _ = fleet
    rows = doc["measurements"]["allreduce"]
    assert rows and rows[0]["backend"] == "gloo" and rows[0]["world_size"] == 4, doc["measurements"]
    assert all(r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"] * 1.5, rel=0.01) for r in rows)
    (result,) = [r for r in doc["results"] if r["id"] == "net-allreduce"]
    assert "of the slowest TCP link" in result["summary"]
    assert rows[-1]["busbw_gb_s"] > 0.5 * 500 / 8000


def test_text_report_has_the_table_and_the_matrix(fleet: Any) -> None:
    proc, _, seconds = fleet
    text = proc.stderr
    assert "fleet of 5 hosts from --hosts" in text and "TCP Mbit/s, row sends to column" in text
    assert any(line.split()[:2] == ["h5", "FAIL"] for line in text.splitlines())
    assert seconds < 150


def test_nothing_is_left_running_or_lying_around(ctl: Controller, fleet: Any) -> None:
    until(lambda: _nothing_running(ctl), 10, what="the remote processes to end")
    for host in ctl.cluster.hosts:
        assert list((host.root / "tmp").iterdir()) == [], host.name


def _nothing_running(ctl: Controller) -> bool:
    """True once no process but the hosts' sshd runs under the cluster's folders (asserts, naming them, before)."""
    sshd = {h.sshd.pid for h in ctl.cluster.hosts if h.sshd is not None}
    left = [p for p in ctl.cluster.processes_under(ctl.cluster.root) if p not in sshd and not _is_sshd(p)]
    assert left == [], [_cmdline(p) for p in left]
    return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b"(ended)"


def _is_sshd(pid: int) -> bool:
    try:
        return b"sshd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wrapper(path: Path, body: str) -> str:
    path.write_text(f'#!/bin/sh\ncase " $* " in *" -m invoke "*) {body} ;; esac\nexec {python_for_hosts()} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (no SSH banner)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for s in held:
        s.close()
    server.close()


def test_each_way_a_host_can_fail_is_one_row_and_the_others_finish(ctl: Controller, silent_port: int) -> None:
    marker = ctl.home / "h4-started"
    hostfile = ctl.home / "hosts"
    hostfile.write_text(
        "\n".join([
            "h1",
            f"h2 python={_wrapper(ctl.home / 'dying-python', 'kill -9 $$')}",
            "h3-stranger",
            f"h4 python={_wrapper(ctl.home / 'stalling-python', f'touch {marker}; exec sleep 30')}",
            "h5",
            f"127.0.0.1:{silent_port}",
            "gpu-preflight-no-such-host.invalid",
        ]) + "\n"
    )  # fmt: skip
    h4 = ctl.cluster.hosts[3]
    ctl.cluster.stop_sshd(ctl.cluster.hosts[4])
    proc = subprocess.Popen(ctl.argv("--hosts-file", str(hostfile), "--json", "-"), cwd=REPO, env=ctl.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        until(marker.exists, 60, what="h4 to start its bootstrap", while_running=proc)
        subprocess.run(["ip", "link", "set", h4.veth_outside, "down"], check=True)  # h4 drops off the network
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["ip", "link", "set", h4.veth_outside, "up"], check=False)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in ctl.cluster.processes_under(h4.root):  # what a host that dropped off keeps running
            if not _is_sshd(pid):
                os.kill(pid, signal.SIGKILL)
    doc = json.loads(out)
    reasons = {h["host"]: (h["status"], h["reason"] or "") for h in doc["hosts"]}
    assert reasons["h1"] == ("ok", ""), err[-2000:]
    expected = {
        "h2": "died mid-run: bootstrap was killed",
        "h3-stranger": "authentication refused",
        "h4": "died mid-run: the SSH connection was lost",
        "h5": "connection refused",
        f"127.0.0.1:{silent_port}": "no SSH banner",
        "gpu-preflight-no-such-host.invalid": "cannot resolve",
    }
    for host, needle in expected.items():
        assert reasons[host][0] == "fail" and needle in reasons[host][1], (host, reasons[host])
    assert proc.returncode == 1 and "Traceback" not in err
    assert doc["measurements"]["links"] == []


def test_no_python_and_missing_dependencies_are_named(ctl: Controller) -> None:
    hostfile = ctl.home / "hosts-python"
    bare = _wrapper(ctl.home / "bare-python", 'exec /usr/bin/env -i /usr/bin/python3 -c "import invoke"')
    hostfile.write_text(f"h1 python=/nonexistent/python3\nh2 python={bare}\n")
    proc = ctl.run("--hosts-file", str(hostfile), "--json", "-")
    reasons = {h["host"]: h["reason"] for h in json.loads(proc.stdout)["hosts"]}
    assert reasons["h1"].startswith("no Python: '/nonexistent/python3' is not on PATH")
    assert "lacks gpu-preflight's dependencies (No module named 'invoke')" in reasons["h2"]
    assert "-m pip install ." in reasons["h2"]


def test_ctrl_c_stops_remote_processes_and_removes_their_files(ctl: Controller) -> None:
    hosts = ctl.cluster.hosts[1:3]
    proc = subprocess.Popen(ctl.argv("--hosts", "h2,h3", disk=True), cwd=REPO, env=ctl.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint)  # fmt: skip
    try:
        until(
            lambda: all(_scratch(h.home) for h in hosts),
            90,
            what="both remote bootstraps to write disk test files",
            while_running=proc,
        )
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "gpu-preflight: interrupted"
    until(lambda: _nothing_running(ctl), 10, what="the remote processes to end")
    for host in hosts:
        assert not _scratch(host.home) and list((host.root / "tmp").iterdir()) == [], host.name


def _scratch(home: Path) -> list[Path]:
    return list(home.glob(".gpu-preflight-disk-*"))


@pytest.mark.measures
def test_builtin_link_test_matches_the_shaped_rate(ctl: Controller) -> None:
    """The built-in sender/receiver (no iperf3) through the library, on a 500 and a 2000 Mbit/s host."""
    from checks.config import make_config
    from provision.flow import Hosts
    from provision.hosts import parse_host
    from provision.remote_net import measure_links

    cfg = make_config({"hosts": {"python": python_for_hosts(), "connect_timeout_s": 5.0}})
    net = replace(cfg.network, use_iperf3=False, link_seconds=1.5, link_omit_s=0.5)
    os.environ["HOME"], home = str(ctl.home), os.environ.get("HOME", "")
    try:
        with Hosts() as hosts:
            readied = [hosts.ready(parse_host(name), cfg, REPO) for name in ("h1", "h2")]
            links, skipped = measure_links(readied, net, lambda line: None)
    finally:
        os.environ["HOME"] = home
    assert skipped is None and {x.tool for x in links} == {"builtin"}
    for link in links:
        assert abs(link.tcp_mbit_s / 500 - 1) <= 0.10, link  # type: ignore[operator]
