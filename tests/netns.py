"""Test hosts for fleet runs: network namespaces on a bridge, each with a real sshd, links shaped with tc.

Each host is a namespace ``gpf<pid>c<n>h<N>`` joined to a bridge ``gpf<pid>c<n>br`` in the root namespace by a veth
pair; the bridge holds the controller's address (.1). Each host runs Debian's ``/usr/sbin/sshd -D -f <its config>``
inside ``ip netns exec`` with a throwaway host key, and accepts a throwaway client key; its HOME and TMPDIR are
directories of its own (sshd ``SetEnv``), so a bootstrap "there" writes only under the test's temporary
directory. ``tc tbf`` shapes both ends of a host's veth, so a pair of hosts is limited by the slower of the two.

Everything is created by the test and removed by PID and by name when it ends (also when it fails); names carry
the test process's PID, and leftovers of a killed earlier run (a PID that no longer exists) are removed first.
Only the test's own namespaces and loopback are used.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


@functools.cache
def unavailable() -> str | None:
    """Why namespace hosts cannot be built here, or None (asked once per session: each host suite asks twice)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install {package})"
    if not Path(SSHD).exists():
        return "needs sshd (apt-get install openssh-server)"
    name = f"gpf{os.getpid()}probe"
    probe = _run("ip", "netns", "add", name, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    _run("ip", "netns", "del", name, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_pids(name: str) -> list[int]:
    """PIDs of the processes inside network namespace ``name``."""
    out = _run("ip", "netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def controller_env(home: Path) -> dict[str, str]:
    """The environment of a test's controller: this one without settings that would leak into the run (the
    developer's INVOKE_PREFLIGHT_*, ssh agent, a SLURM allocation), with its own HOME and no colour."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_PREFLIGHT_", "SSH_AUTH_SOCK", "SLURM_"))}
    return keep | {"HOME": str(home), "NO_COLOR": "1"}


def remove_leftovers() -> None:
    """Delete namespaces and links of earlier test runs whose process is gone."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        match = re.match(r"^gpf(\d+)\w*", line)
        if match and not _alive(int(match.group(1))):
            for pid in _netns_pids(match.group(0)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _run("ip", "netns", "del", match.group(0), check=False)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        match = re.search(r"\d+: (gpf(\d+)\w*)[@:]", line)
        if match and not _alive(int(match.group(2))):
            _run("ip", "link", "del", match.group(1), check=False)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no interface of this machine uses."""
    used = _run("ip", "-4", "-o", "addr", "show", check=False).stdout
    nets = [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", used)]
    for third in range(os.getpid() % 200 + 20, 256):
        candidate = ipaddress.IPv4Network(f"10.213.{third}.0/24")
        if not any(candidate.overlaps(n) for n in nets):
            return candidate
    raise RuntimeError("no free 10.213.x.0/24 subnet")


_CLUSTERS = itertools.count()


@dataclass
class NsHost:
    """One namespace host."""

    name: str  # the alias in the client's ssh config
    netns: str
    address: str
    root: Path  # its directory: sshd config, home, tmp
    rate_mbit: int | None = None
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def veth_outside(self) -> str:
        return f"{self.netns}a"


@dataclass
class Cluster:
    """Namespace hosts on one bridge, a client key and an ssh config naming them."""

    root: Path
    subnet: ipaddress.IPv4Network
    # gpf<pid>c<n>: a second cluster of the same process gets new names, as a namespace's veths go away
    # asynchronously after `ip netns del` (the next cluster's `ip link add` could meet the last one's link).
    prefix: str = field(default_factory=lambda: f"gpf{os.getpid()}c{next(_CLUSTERS) % 10}")
    hosts: list[NsHost] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def controller_address(self) -> str:
        return str(self.subnet.network_address + 1)

    def start_bridge(self) -> None:
        remove_leftovers()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.controller_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        self.root.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "client_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "stranger_key"))

    def add_host(self, rate_mbit: int | None = None) -> NsHost:
        number = len(self.hosts) + 1
        host = NsHost(
            f"h{number}",
            f"{self.prefix}h{number}",
            str(self.subnet.network_address + 10 + number),
            self.root / f"h{number}",
            rate_mbit,
        )
        self.hosts.append(host)
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.veth_outside, "type", "veth", "peer", "name", f"{host.netns}b")
        _run("ip", "link", "set", f"{host.netns}b", "netns", host.netns)
        _run("ip", "link", "set", host.veth_outside, "master", self.bridge, "up")
        inside = ["ip", "netns", "exec", host.netns]
        _run(*inside, "ip", "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", f"{host.netns}b")
        _run(*inside, "ip", "link", "set", f"{host.netns}b", "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        if rate_mbit:
            self.shape(host, rate_mbit)
        self.start_sshd(host)
        return host

    def shape(self, host: NsHost, rate_mbit: int) -> None:
        """tbf on both ends of the host's veth: its upload and its download run at ``rate_mbit``."""
        burst = str(max(256 * 1024, rate_mbit * 1_000_000 // 8 // 500))  # >= 2 ms of traffic, >= a GSO packet
        for netns, dev in ((None, host.veth_outside), (host.netns, f"{host.netns}b")):
            prefix = ["ip", "netns", "exec", netns] if netns else []
            _run(
                *prefix,
                "tc",
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                burst,
                "latency",
                "50ms",
            )
        host.rate_mbit = rate_mbit

    def _sshd_config(self, host: NsHost) -> Path:
        for d in (host.root, host.home, host.root / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        key = host.root / "ssh_host_ed25519_key"
        if not key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        (host.root / "authorized_keys").write_text((self.root / "client_key.pub").read_text())
        config = host.root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}",
                    "Port 22",
                    f"HostKey {key}",
                    f"PidFile {host.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {host.root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    f"SetEnv HOME={host.home} TMPDIR={host.root / 'tmp'}",
                    "PrintMotd no",
                    "LogLevel ERROR",
                    "MaxStartups 100",
                    "MaxSessions 100",
                ]
            )
            + "\n"
        )
        return config

    def start_sshd(self, host: NsHost) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        config = self._sshd_config(host)
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(host.root / "sshd.log", "ab"),  # noqa: SIM115 - the child keeps it
        )
        self._wait_listening(host)

    def _wait_listening(self, host: NsHost, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((host.address, 22), timeout=0.5):
                return
            if host.sshd is not None and host.sshd.poll() is not None:
                raise RuntimeError(f"sshd of {host.name} exited: {(host.root / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.05)
        raise RuntimeError(f"sshd of {host.name} did not listen within {timeout} s")

    def stop_sshd(self, host: NsHost) -> None:
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.terminate()
            host.sshd.wait(10)
        host.sshd = None

    def ssh_config(self, extra: str = "") -> str:
        """Client ssh config: every host by alias, the throwaway key, no known_hosts."""
        blocks = [
            f"Host {h.name}\n  HostName {h.address}\n  User root\n  IdentityFile {self.root / 'client_key'}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            for h in self.hosts
        ]
        return "".join(blocks) + extra

    def processes_under(self, path: Path) -> list[int]:
        """PIDs of processes whose command line or working directory is under ``path`` (leak detection)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(proc / "cwd")
                if str(path) in cmdline or cwd.startswith(str(path)):
                    found.append(int(proc.name))
        return found

    def close(self) -> None:
        """Stop every sshd by PID, delete the namespaces and the bridge."""
        for host in self.hosts:
            with contextlib.suppress(Exception):
                self.stop_sshd(host)
        for pid in self.processes_under(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for host in self.hosts:
            # sshd's per-connection children ("sshd: root@notty") outlive the daemon and show no test path:
            # kill whatever still runs inside the namespace, or it lingers after the namespace is deleted.
            for pid in _netns_pids(host.netns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _run("ip", "netns", "del", host.netns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)


@contextlib.contextmanager
def cluster(root: Path, rates: list[int | None]) -> Iterator[Cluster]:
    """A cluster of ``len(rates)`` namespace hosts (rate in Mbit/s, None: unshaped), torn down afterwards."""
    built = Cluster(root, free_subnet())
    try:
        built.start_bridge()
        for rate in rates:
            built.add_host(rate)
        yield built
    finally:
        built.close()


def python_for_hosts() -> str:
    """The interpreter the namespace hosts run bootstrap with (sshd's PATH would find the system one)."""
    return sys.executable
