"""How ``provision.remote.connect`` words a peer that is no SSH server, against real sockets on loopback.

The hosts of tests/netns.py cover the other ways (refused, unresolvable, authentication, dying mid-run) in
test_remote.py; these two need no namespaces, so they run everywhere.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from checks.config import make_config
from provision.hosts import HostSpec
from provision.remote import RemoteError, connect


def _serve(answer: str) -> Iterator[int]:
    """A loopback port whose every connection is closed at once (``close``), reset at once (``reset``: SO_LINGER 0
    sends RST, as a peer that closes before reading the client's banner does) or held without a word (``silent``)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except TimeoutError:
                continue
            if answer == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if answer in ("close", "reset"):
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture(params=["close", "reset"])
def closing_port(request: pytest.FixtureRequest) -> Iterator[int]:
    yield from _serve(request.param)


@pytest.fixture
def silent_port() -> Iterator[int]:
    yield from _serve("silent")


def _reason(port: int, timeout_s: float) -> tuple[str, float]:
    cfg = replace(make_config().hosts, connect_timeout_s=timeout_s)
    start = time.monotonic()
    with pytest.raises(RemoteError) as failed:
        connect(HostSpec(f"127.0.0.1:{port}", "127.0.0.1", port=port), cfg, threading.Event())
    return str(failed.value), time.monotonic() - start


def test_a_peer_that_closes_at_once_is_not_said_to_have_timed_out(closing_port: int) -> None:
    reason, seconds = _reason(closing_port, 10.0)
    assert reason == (
        f"unreachable: 127.0.0.1:{closing_port} closed the connection before any SSH banner (not an SSH server?)"
    )
    assert seconds < 5  # not the banner timeout


def test_a_silent_peer_is_no_ssh_banner_within_the_timeout(silent_port: int) -> None:
    reason, _ = _reason(silent_port, 0.5)
    assert reason == f"unreachable: no SSH banner (handshake) from 127.0.0.1:{silent_port} within 0.5 s"
