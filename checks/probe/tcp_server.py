"""The receiving side of the built-in TCP test: the agent's server, a multi-stream receiver, a timed sender.

Standard library only (see ``checks/probe/tcp.py``, which runs it). Each connection starts with one JSON line:
``{"op": "ping"}`` echoes bytes (round-trip time); ``{"op": "test", "id", "streams", "seconds", "omit"}`` opens a
test whose ``{"op": "sink", "id"}`` connections the server receives and measures, answering with the result on
the test's connection; ``{"op": "source", "seconds"}`` makes the server send (the reverse direction).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

BUFFER = 128 * 1024
HEADER_MAX = 4096


def _header(conn: socket.socket) -> dict[str, Any]:
    """Read one JSON line (the op and its parameters) from a fresh connection."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk or len(data) > HEADER_MAX:
            raise ConnectionError("no header")
        data += chunk
    return dict(json.loads(data))


def send_line(conn: socket.socket, obj: Any) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


class Receiver:
    """Counts bytes of several streams after a shared window start (start of the first stream + omit)."""

    def __init__(self, omit: float) -> None:
        self.omit = omit
        self.window_start: float | None = None
        self.lock = threading.Lock()
        self.counted: list[tuple[int, float]] = []

    def _start(self) -> float:
        with self.lock:
            if self.window_start is None:
                self.window_start = time.monotonic() + self.omit
            return self.window_start

    def stream(self, conn: socket.socket) -> None:
        """Receive one stream until EOF."""
        window, buf, counted, last = self._start(), bytearray(BUFFER), 0, 0.0
        view = memoryview(buf)
        with conn:
            while True:
                n = conn.recv_into(view)
                if n == 0:
                    break
                now = time.monotonic()
                if now >= window:
                    counted, last = counted + n, now
        with self.lock:
            self.counted.append((counted, last))

    def result(self, streams: int) -> dict[str, Any]:
        total = sum(c for c, _ in self.counted)
        end = max((t for _, t in self.counted), default=0.0)
        spent = end - (self.window_start or end)
        if total <= 0 or spent <= 0:
            return {"error": "no data arrived after the omitted start", "streams": streams}
        return {
            "mbit_s": round(total * 8 / spent / 1e6, 1),
            "bytes": total,
            "seconds": round(spent, 3),
            "streams": streams,
            "tool": "builtin",
        }


def send_for(conn: socket.socket, until: float) -> None:
    """Send zeros until ``until`` (monotonic), then close the write side."""
    block = bytes(BUFFER)
    with conn:
        while time.monotonic() < until:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(10)
        while conn.recv(BUFFER):  # wait for the peer to close: everything sent was received
            pass


class Server:
    """Accepts tests until ``idle`` seconds pass without a new connection."""

    def __init__(self, bind: str, port: int, idle: float) -> None:
        self.sock = socket.create_server((bind, port), backlog=128)
        self.idle = idle
        self.tests: dict[str, tuple[Receiver, threading.Semaphore]] = {}
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        self.sock.settimeout(0.5)
        last = time.monotonic()
        while time.monotonic() - last < self.idle:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            last = time.monotonic()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(120)
            head = _header(conn)
            op = head.get("op")
            if op == "ping":
                self._pong(conn)
            elif op == "test":
                self._control(conn, head)
            elif op == "sink":
                self._sink(conn, str(head.get("id")))
            elif op == "source":
                send_for(conn, time.monotonic() + float(head.get("seconds", 1.0)))
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _pong(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while byte := conn.recv(1):
            conn.sendall(byte)

    def _control(self, conn: socket.socket, head: dict[str, Any]) -> None:
        test_id, streams = str(head["id"]), int(head["streams"])
        receiver, finished = Receiver(float(head.get("omit", 0.0))), threading.Semaphore(0)
        with self.lock:
            self.tests[test_id] = (receiver, finished)
        send_line(conn, {"ready": True})
        deadline = time.monotonic() + float(head.get("seconds", 10.0)) + float(head.get("omit", 0.0)) + 30
        for _ in range(streams):
            if not finished.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        with self.lock:
            self.tests.pop(test_id, None)
        send_line(conn, receiver.result(streams))

    def _sink(self, conn: socket.socket, test_id: str) -> None:
        with self.lock:
            receiver, finished = self.tests[test_id]
        try:
            receiver.stream(conn)
        finally:
            finished.release()
