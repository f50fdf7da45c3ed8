"""One SSH session per host (fabric): connect with the user's SSH config, run commands that can be stopped, ship
the checkout, and remember what was started there so that Ctrl-C can stop it and remove its temporary files.

Every remote command is ``sh -c '<script>'`` with each value passed through ``shlex.quote``; host strings are
validated in ``provision/hosts.py`` and never interpolated into a shell here. Long commands print their PID
first (``echo $$; exec ...``) so that cleanup can ``kill`` exactly them.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field

import fabric
import paramiko

from checks.config import HostsConfig
from provision.hosts import HostSpec

# paramiko's transport thread logs failed handshakes with a traceback; without a handler of its own, Python
# prints that to stderr. Every failure is worded in the report instead (a user's logging config still applies).
logging.getLogger("paramiko").addHandler(logging.NullHandler())
POLL_S = 0.05
MARKER = ".gpu-preflight-checkout"  # marks a directory as ours: only such a directory is synced with --delete


class RemoteError(Exception):
    """A host-level failure, worded for the report's fail row."""


class Stopped(Exception):
    """The run was interrupted (Ctrl-C) while this host was being worked on."""


@dataclass(frozen=True)
class Prepared:
    """What a host said before the run: its Python (shell text), checkout and temp directories, tools."""

    python: str
    directory: str  # absolute
    tmp: str
    rsync: bool
    iperf3: bool


@dataclass(frozen=True)
class Completed:
    """A finished remote command."""

    code: int  # -1: killed by a signal, or no exit status
    out: str
    err: str


def remote_path(path: str) -> str:
    """Quote ``path`` for the remote shell: ``~/x`` and relative paths are under the remote ``$HOME``."""
    if "\n" in path or "\0" in path:
        raise RemoteError(f"unusable remote path {path!r}")
    if path.startswith("/"):
        return shlex.quote(path)
    rest = path[2:] if path.startswith("~/") else "" if path == "~" else path
    return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"'


def shell(script: str) -> str:
    """Wrap a POSIX ``script`` for the remote command line, whatever the user's login shell is."""
    return "exec sh -c " + shlex.quote(script)


def connect_error(exc: BaseException, spec: HostSpec, timeout: float) -> RemoteError:
    """Word a connection failure: unreachable, refused, authentication, host key, no SSH server."""
    where = f"{spec.host}:{spec.port or 22}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))  # paramiko wraps the socket error of each address it tried
    if isinstance(exc, paramiko.AuthenticationException):
        return RemoteError(f"authentication refused ({exc}): check the key for this host (~/.ssh/config, ssh-agent)")
    if isinstance(exc, paramiko.BadHostKeyException):
        return RemoteError(f"host key mismatch for {spec.host}: {exc} (see ~/.ssh/known_hosts)")
    if isinstance(exc, ConnectionRefusedError):
        return RemoteError(f"unreachable: connection refused at {where} (no SSH server listening)")
    if isinstance(exc, socket.gaierror):
        return RemoteError(f"unreachable: cannot resolve {spec.host!r} ({exc.strerror})")
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return RemoteError(f"unreachable: no answer from {where} within {timeout:g} s")
    # A peer that closes at once: paramiko's banner error over EOFError, or over ConnectionResetError (it closed
    # before reading this side's banner, so its kernel sent a reset); or either of them bare, when the close or
    # the reset came while this side was still sending its own banner.
    closed = (EOFError, ConnectionResetError)
    if isinstance(exc, closed) or (isinstance(exc, paramiko.SSHException) and isinstance(exc.__context__, closed)):
        return RemoteError(f"unreachable: {where} closed the connection before any SSH banner (not an SSH server?)")
    if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc).lower() or "No existing session" in str(exc)):
        # paramiko says "No existing session" when the handshake never started before authentication
        return RemoteError(f"unreachable: no SSH banner (handshake) from {where} within {timeout:g} s")
    if isinstance(exc, OSError):
        return RemoteError(f"unreachable: {exc.strerror or exc} ({where})")
    return RemoteError(f"SSH failed: {type(exc).__name__}: {exc}")


@dataclass
class Session:
    """A connected host and what this run started there."""

    spec: HostSpec
    conn: fabric.Connection
    stop: threading.Event
    pids: set[int] = field(default_factory=set)
    temp_dirs: set[str] = field(default_factory=set)
    channels: list[paramiko.Channel] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError("died mid-run: the SSH connection was lost")
        return transport

    def peer_address(self) -> str:
        """Say where other hosts reach this one: ``addr=`` from the hosts file, else the address SSH reached."""
        if self.spec.addr:
            return self.spec.addr
        sock = self.transport.sock
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                return str(sock.getpeername()[0])
        return self.conn.host

    def run(
        self, script: str, timeout: float, stdin: bytes | None = None, track: bool = False, stoppable: bool = True
    ) -> Completed:
        """Run ``script`` under ``sh -c``; ``track``: it prints its PID first, and Ctrl-C kills it."""
        command = shell(("echo $$; " if track else "") + script)
        chan = self.transport.open_session(timeout=30)
        try:
            chan.settimeout(POLL_S)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin)
                chan.shutdown_write()
            return self._collect(chan, timeout, track, stoppable)
        finally:
            chan.close()

    def _collect(self, chan: paramiko.Channel, timeout: float, track: bool, stoppable: bool) -> Completed:
        out, err, deadline, pid = bytearray(), bytearray(), time.monotonic() + timeout, None
        while True:
            if stoppable and self.stop.is_set():
                raise Stopped
            if time.monotonic() > deadline:
                raise RemoteError(f"timed out: not finished within {timeout:g} s")
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if track and pid is None and b"\n" in out:
                line, _, rest = bytes(out).partition(b"\n")
                pid, out = int(line or b"0"), bytearray(rest)
                with self.lock:
                    self.pids.add(pid)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if not self.transport.is_active():
                raise RemoteError("died mid-run: the SSH connection was lost")
            time.sleep(POLL_S)
        if pid is not None:
            with self.lock:
                self.pids.discard(pid)
        code = chan.recv_exit_status()
        transport = self.conn.client.get_transport()
        if code == -1 and (transport is None or not transport.is_active()):
            raise RemoteError("died mid-run: the SSH connection was lost")
        return Completed(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def start(self, script: str, timeout: float) -> str:
        """Start a long-running ``script`` (tracked, left running); return the first line it prints."""
        chan = self.transport.open_session(timeout=30)
        chan.settimeout(POLL_S)
        chan.exec_command(shell("echo $$; " + script))
        out, deadline = bytearray(), time.monotonic() + timeout
        while out.count(b"\n") < 2:
            if self.stop.is_set():
                raise Stopped
            if chan.exit_status_ready() and not chan.recv_ready():
                raise RemoteError(f"exited at start: {chan.recv_stderr(4096).decode(errors='replace').strip()}")
            if time.monotonic() > deadline:
                raise RemoteError(f"no answer within {timeout:g} s")
            if chan.recv_ready():
                out += chan.recv(65536)
            else:
                time.sleep(POLL_S)
        pid, line = bytes(out).split(b"\n")[:2]
        with self.lock:
            self.pids.add(int(pid))
            self.channels.append(chan)
        return line.decode(errors="replace")

    def kill(self, timeout: float = 10.0) -> None:
        """Stop every process this run started here (SIGTERM; they clean up after themselves)."""
        with self.lock:
            pids = sorted(self.pids)
            self.pids.clear()
        if pids:
            with contextlib.suppress(RemoteError, paramiko.SSHException, OSError, EOFError):
                self.run(f"kill -TERM {' '.join(map(str, pids))} 2>/dev/null; true", timeout, stoppable=False)

    def cleanup(self, timeout: float = 10.0) -> None:
        """Stop what this run started here and remove its temporary directories (best effort, bounded)."""
        with self.lock:
            pids, dirs = sorted(self.pids), sorted(self.temp_dirs)
            self.pids.clear()
            self.temp_dirs.clear()
        parts = [f"kill -TERM {' '.join(map(str, pids))} 2>/dev/null"] if pids else []
        parts += [f"rm -rf -- {shlex.quote(d)}" for d in dirs]
        if not parts:
            return
        with contextlib.suppress(RemoteError, paramiko.SSHException, OSError, EOFError):
            self.run("; ".join(parts) + "; true", timeout, stoppable=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def connect(spec: HostSpec, cfg: HostsConfig, stop: threading.Event) -> Session:
    """Open the SSH connection (user's ~/.ssh/config, keys, agent); bounded connect, banner and auth timeouts."""
    timeout = cfg.connect_timeout_s
    config = fabric.Config(overrides={"timeouts": {"connect": max(1, int(timeout))}})
    kwargs = {"banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout}
    conn = fabric.Connection(spec.host, user=spec.user, port=spec.port, config=config, connect_kwargs=kwargs)
    try:
        conn.open()
    except Exception as exc:  # noqa: BLE001 - every way a connection fails becomes one worded fail row
        conn.close()
        raise connect_error(exc, spec, timeout) from None
    transport = conn.client.get_transport()
    if transport is not None:
        transport.set_keepalive(max(1, int(cfg.dead_after_s // 3)))
        _dead_after(transport.sock, cfg.dead_after_s)
    return Session(spec, conn, stop)


def _dead_after(sock: object, seconds: float) -> None:
    """Let the kernel drop the connection when the host stops acknowledging for ``seconds`` (Linux)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if isinstance(sock, socket.socket) and option is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
