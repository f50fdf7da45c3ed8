"""Real servers on loopback for transfer tests: an HTTP server that drops connections, and an sshd of our own."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.loopback import serve


@dataclass
class Files:
    """What the HTTP server serves and what it saw."""

    blobs: dict[str, bytes]
    drop_after: int = 0  # bytes of a body sent before the connection is cut, for the first `drops` responses
    drops: int = 0
    ranges: bool = True
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, Range header)


def _handler(files: Files) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            files.requests.append((self.command, self.headers.get("Range", "")))
            data = files.blobs.get(self.path)
            if data is None:
                self.send_error(404)
                return
            start = self._range_start() if files.ranges else 0
            if start >= len(data) and start:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206 if start else 200)
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if body:
                self._body(data[start:])

        def _range_start(self) -> int:
            value = self.headers.get("Range", "")
            return int(value.removeprefix("bytes=").split("-")[0]) if value.startswith("bytes=") else 0

        def _body(self, payload: bytes) -> None:
            if files.drops > 0 and files.drop_after < len(payload):
                files.drops -= 1
                self.wfile.write(payload[: files.drop_after])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # the connection dies mid-body
                self.close_connection = True
                return
            self.wfile.write(payload)

    return Handler


def http_server(files: Files) -> AbstractContextManager[str]:
    """Serve ``files`` on 127.0.0.1 in a thread; yield the base URL."""
    return serve(_handler(files))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sshd(tmp: Path) -> Iterator[str]:
    """Run a throwaway sshd on loopback that accepts one generated key; yield the ssh command for rsync -e."""
    daemon, keygen = shutil.which("sshd") or "/usr/sbin/sshd", shutil.which("ssh-keygen")
    if os.geteuid() != 0 or not Path(daemon).exists() or keygen is None or shutil.which("ssh") is None:
        pytest.skip("a loopback sshd needs root, openssh-server and openssh-client")
    for name in ("host", "user"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    (tmp / "authorized_keys").write_bytes((tmp / "user.pub").read_bytes())
    port = _free_port()
    config = tmp / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host'}\nAuthorizedKeysFile {tmp / 'authorized_keys'}\n"
        f"PidFile {tmp / 'sshd.pid'}\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory sshd insists on
    proc = subprocess.Popen([daemon, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        _wait_for_port(port, proc)
        yield (
            f"ssh -p {port} -i {tmp / 'user'} -o BatchMode=yes -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.skip("sshd did not listen in time")
