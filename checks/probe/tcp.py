"""Built-in TCP throughput and round-trip tests between two hosts, and the agent each host runs for them.

Standard library only: the agent runs from the shipped checkout with the host's Python, before (or without)
gpu-preflight's dependencies. Run from the checkout; each command prints one JSON object::

    python -m checks.probe.tcp serve [--bind ADDR] [--idle S] [--iperf3-port P]   # {"port", "iperf3_port", "pid"}
    python -m checks.probe.tcp client HOST PORT [--streams K] [--seconds S] [--omit O] [--reverse]
    python -m checks.probe.tcp iperf3 HOST PORT [--streams K] [--seconds S] [--omit O] [--reverse]
    python -m checks.probe.tcp rtt HOST PORT [--count N]
    python -m checks.probe.tcp free-port | route HOST

The receiver measures, as iperf3 does: bytes that arrived after the first ``omit`` seconds (TCP slow start),
divided by the time they took. ``--reverse`` makes the server send (iperf3 -R), so one server per host pair
measures both directions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from checks.probe.iperf import iperf3_client, iperf3_server
from checks.probe.tcp_server import Receiver, Server, send_for, send_line


def _connect(host: str, port: int, head: dict[str, Any], timeout: float = 10.0) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=timeout)
    send_line(conn, head)
    return conn


def _run_threads(targets: list[tuple[Any, tuple[Any, ...]]]) -> None:
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def tcp_forward(host: str, port: int, streams: int, seconds: float, omit: float) -> dict[str, Any]:
    """Send to the server over ``streams`` connections; the server measures what arrives."""
    test_id = uuid.uuid4().hex
    with _connect(
        host,
        port,
        {"op": "test", "id": test_id, "streams": streams, "seconds": seconds, "omit": omit},
        timeout=seconds + omit + 60,
    ) as ctrl:
        ctrl_file = ctrl.makefile("r")
        json.loads(ctrl_file.readline())
        conns = [_connect(host, port, {"op": "sink", "id": test_id}) for _ in range(streams)]
        until = time.monotonic() + omit + seconds
        _run_threads([(send_for, (c, until)) for c in conns])
        return dict(json.loads(ctrl_file.readline() or "{}"))


def tcp_reverse(host: str, port: int, streams: int, seconds: float, omit: float) -> dict[str, Any]:
    """Receive from the server over ``streams`` connections and measure what arrives."""
    receiver = Receiver(omit)
    conns = [
        _connect(host, port, {"op": "source", "seconds": omit + seconds}, timeout=seconds + omit + 60)
        for _ in range(streams)
    ]
    _run_threads([(receiver.stream, (c,)) for c in conns])
    return receiver.result(streams)


def rtt(host: str, port: int, count: int) -> dict[str, Any]:
    """Time round trips of one byte on an idle connection with Nagle off; the median (first one dropped)."""
    with _connect(host, port, {"op": "ping"}) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(count + 1):
            start = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                return {"error": "the server closed the connection"}
            times.append(time.perf_counter() - start)
    return {"rtt_ms": round(statistics.median(times[1:]) * 1000, 3), "count": count}


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin pairing of n hosts (the circle method): every pair exactly once, lower index first, no host
    twice in a round. The schedule of the link tests, over SSH and inside a job."""
    ids: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    out = []
    for _ in range(len(ids) - 1):
        half = len(ids) // 2
        pairs = [(ids[i], ids[-1 - i]) for i in range(half)]
        out.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return out


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
BELOW_EPHEMERAL = 8000  # how far below the ephemeral range a free port is looked for


def free_port(host: str = "", span: int = 1, ranges: str = EPHEMERAL_RANGE, below: int = BELOW_EPHEMERAL) -> int:
    """A TCP port that ``span`` ports from it are free at ``host`` right now ("": every address, as a rendezvous
    that other hosts reach needs; "127.0.0.1" for one box), so a busy 29500 never blocks torch.distributed; drawn
    below the kernel's ephemeral range (``ranges``), never from it. A client that retries connecting to a local port
    inside that range, before its server listens (a TCPStore's other ranks), can be given that very port as its
    own and connect to itself (TCP simultaneous open): it then waits on itself for its whole timeout, and the server
    cannot bind (docs/sources.md#tcp-self-connect). Looked for in the ``below`` ports under the range; with no free
    run there, the kernel's pick."""
    try:
        low = int(Path(ranges).read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    first = max(1024, low - below)
    for _ in range(200):
        base = random.randrange(first, max(first + 1, low - span + 1))
        if all(_bindable(host, base + k) for k in range(span)):
            return base
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def route(host: str) -> dict[str, Any]:
    """Find the local address and interface that traffic to ``host`` leaves from (GLOO/NCCL_SOCKET_IFNAME)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP connect sends nothing; it only picks the route
        address = s.getsockname()[0]
    return {"address": address, "interface": _interface_of(address)}


def _interface_of(address: str) -> str | None:
    try:
        import psutil  # a gpu-preflight dependency; absent on a host without them

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == address for a in addrs):
                return name
    except ImportError:
        return None
    return None


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(args: argparse.Namespace) -> None:
    """Serve until idle; SIGTERM and SIGHUP stop it cleanly (the iperf3 child is stopped too)."""
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _stop)
    server = Server(args.bind, args.port, args.idle)
    child, iperf_port = iperf3_server(args.iperf3_port) if args.iperf3_port else (None, None)
    print(json.dumps({"port": server.port, "iperf3_port": iperf_port, "pid": os.getpid()}), flush=True)
    try:
        server.serve()
    finally:
        if child is not None:
            child.terminate()
            child.wait(5)


def _client(args: argparse.Namespace) -> dict[str, Any]:
    if args.command == "iperf3":
        return iperf3_client(args.host, args.port, args.streams, args.seconds, args.omit, args.reverse)
    measure = tcp_reverse if args.reverse else tcp_forward
    return measure(args.host, args.port, args.streams, args.seconds, args.omit)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.probe.tcp", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--bind", default="")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--idle", type=float, default=120.0)
    serve.add_argument("--iperf3-port", type=int, default=0)
    for name in ("client", "iperf3"):
        c = sub.add_parser(name)
        c.add_argument("host")
        c.add_argument("port", type=int)
        c.add_argument("--streams", type=int, default=4)
        c.add_argument("--seconds", type=float, default=3.0)
        c.add_argument("--omit", type=float, default=0.5)
        c.add_argument("--reverse", action="store_true")
    ping = sub.add_parser("rtt")
    ping.add_argument("host")
    ping.add_argument("port", type=int)
    ping.add_argument("--count", type=int, default=20)
    sub.add_parser("free-port")
    r = sub.add_parser("route")
    r.add_argument("host")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one agent command; print its JSON result (errors too, as {"error": ...})."""
    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            _serve(args)
            return 0
        actions = {
            "rtt": lambda: rtt(args.host, args.port, args.count),
            "free-port": lambda: {"port": free_port()},
            "route": lambda: route(args.host),
        }
        result = actions[args.command]() if args.command in actions else _client(args)
    except (OSError, ValueError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
