"""Downloads and the TCP agent for real, on loopback only: HTTP servers (a fast one, a slow one, a proxy) and
the agent process with its iperf3 server."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from checks.probe.net import download, measure_downloads
from checks.probe.tcp import free_port, route
from tests.loopback import serve
from tests.waiting import until

REPO = Path(__file__).resolve().parents[3]
MIB = 1024**2
BODY = os.urandom(4 * MIB)


class Handler(http.server.BaseHTTPRequestHandler):
    """/big: 4 MiB at once; /slow: 1 KiB every 0.2 s; anything else: 404. Proxied requests are recorded."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Handler.seen.append(self.path)
        path = self.path.split("?")[0].rsplit("/", 1)[-1]
        if path not in ("big", "slow"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if path == "big":
            self.wfile.write(BODY)
            return
        with contextlib.suppress(OSError):
            for i in range(0, len(BODY), 1024):
                self.wfile.write(BODY[i : i + 1024])
                self.wfile.flush()
                time.sleep(0.2)  # the trickle itself: what the time bound cuts

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """One server for the module's tests: stopping one waits out its 0.5 s poll (socketserver's serve_forever)."""
    with serve(Handler) as url:
        yield url


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> requests.Session:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return requests.Session()


def test_download_measures_rate_latency_and_bytes(session: requests.Session, base: str) -> None:
    d = download(f"{base}/big", session, 64 * MIB, 10.0)
    assert d.error is None and d.status == 200
    assert d.bytes == len(BODY) and d.mb_s and d.mb_s > 1 and d.latency_ms is not None


def test_download_is_bounded_by_bytes(session: requests.Session, base: str) -> None:
    d = download(f"{base}/big", session, MIB, 10.0)
    assert MIB <= d.bytes < len(BODY)


@pytest.mark.slow
def test_slow_server_is_cut_at_the_time_bound_without_error(session: requests.Session, base: str) -> None:
    start = time.monotonic()
    d = download(f"{base}/slow", session, 64 * MIB, 1.5)
    assert time.monotonic() - start < 4
    assert d.error is None and 0 < d.bytes < 20 * 1024 and d.mb_s is not None and d.mb_s < 0.1


def test_errors_never_show_the_secret(session: requests.Session, base: str) -> None:
    missing = download(f"{base}/nope?token=TOPSECRET123", session, MIB, 5.0)
    assert missing.error == "HTTP 404 Not Found" and missing.url.endswith("/nope?token=***")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = download(f"http://alice:PASSWORD9@127.0.0.1:{port}/f?sig=TOPSECRET123", session, MIB, 5.0)
    text = json.dumps(refused.__dict__)
    assert refused.error and "ConnectionError" in refused.error
    assert "TOPSECRET123" not in text and "PASSWORD9" not in text and "alice" not in text


def test_proxy_variables_are_honoured(monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    """The proxy (a loopback HTTP server answering absolute URIs) gets the request for a host that does not exist."""
    Handler.seen.clear()
    monkeypatch.setenv("HTTP_PROXY", base)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    facts = measure_downloads(("http://dataset.invalid/big?key=K3Y-SECRET",), 64, 10.0)
    d = facts.downloads[0]
    assert d.error is None and d.bytes == len(BODY), d
    assert Handler.seen == ["http://dataset.invalid/big?key=K3Y-SECRET"]
    assert d.url == "http://dataset.invalid/big?key=***"


def test_no_url_fetches_nothing() -> None:
    assert measure_downloads((), 64, 10.0).skipped == "no URL configured (preflight.network.download_urls)"


# --- the TCP agent (python -m checks.probe.tcp) -------------------------------------------------------------


def agent(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "checks.probe.tcp", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def served(*extra: str) -> Iterator[tuple[subprocess.Popen[str], dict]]:
    proc = subprocess.Popen([sys.executable, "-m", "checks.probe.tcp", "serve", "--bind", "127.0.0.1", "--idle", "30",
                             *extra], cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc, json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.measures  # a rate and a duration against bounds
def test_builtin_tcp_both_ways_and_rtt_on_loopback() -> None:
    with served() as (_, info):
        port = str(info["port"])
        forward = agent("client", "127.0.0.1", port, "--seconds", "0.5", "--omit", "0.1", "--streams", "2")
        reverse = agent("client", "127.0.0.1", port, "--seconds", "0.5", "--omit", "0.1", "--reverse")
        ping = agent("rtt", "127.0.0.1", port, "--count", "5")
    assert forward["tool"] == "builtin" and forward["mbit_s"] > 100 and forward["streams"] == 2
    assert reverse["mbit_s"] > 100 and 0.3 < reverse["seconds"] < 1.0
    assert 0 < ping["rtt_ms"] < 50


@pytest.mark.slow
@pytest.mark.skipif(subprocess.run(["which", "iperf3"], capture_output=True).returncode != 0, reason="needs iperf3")
def test_iperf3_server_skips_a_port_that_is_taken_and_dies_with_the_agent() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with served("--iperf3-port", str(busy)) as (proc, info):
            assert info["iperf3_port"] not in (None, busy)
            result = agent("iperf3", "127.0.0.1", str(info["iperf3_port"]), "--seconds", "1", "--omit", "0")
            children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert result["tool"] == "iperf3" and result["mbit_s"] > 100
    assert children
    until(
        lambda: not [p for p in children if Path(f"/proc/{p}").exists()],
        10,
        what=f"the agent's children {children} to exit",
    )


def test_route_and_free_port() -> None:
    assert route("127.0.0.1") == {"address": "127.0.0.1", "interface": "lo"}
    port = free_port()
    with socket.socket() as s:  # free on every address, loopback included
        s.bind(("127.0.0.1", port))
    assert 0 < free_port("127.0.0.1") < 65536
    assert 0 < agent("free-port")["port"] < 65536  # the agent the fleet asks for the rendezvous port


def test_a_free_port_is_drawn_below_the_ephemeral_range_with_its_span_free(tmp_path: Path) -> None:
    """A client that retries a local port inside the ephemeral range can be handed that port and connect to
    itself; the rendezvous port (and the exchange's, one above it) come from below the range, all of the span
    free, and a busy port is never returned."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port("127.0.0.1", span=2)
        assert low - 8000 <= port and port + 1 < low, (port, low)
        with socket.socket() as a, socket.socket() as b:  # both free
            a.bind(("127.0.0.1", port))
            b.bind(("127.0.0.1", port + 1))
    # a range file that leaves one run of two free ports: it is the one found, its busy neighbours never
    ranges = tmp_path / "range"
    held = []
    try:
        base = free_port("127.0.0.1", span=6)
        for k in (0, 1, 4, 5):
            s = socket.socket()
            s.bind(("127.0.0.1", base + k))
            s.listen()
            held.append(s)
        ranges.write_text(f"{base + 6}\t60999\n")  # looked for in the 6 ports below: base .. base + 5
        assert {free_port("127.0.0.1", span=2, ranges=str(ranges), below=6) for _ in range(30)} == {base + 2}
    finally:
        for s in held:
            s.close()


@pytest.mark.slow
def test_agent_reports_errors_as_json() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    assert "error" in agent("client", "127.0.0.1", port, "--seconds", "0.2")


@pytest.mark.slow
def test_bootstrap_reports_downloads_and_never_prints_the_secret(tmp_path: Path, base: str) -> None:
    """End to end: a configured URL with a token, fetched by `invoke bootstrap`; the token appears nowhere."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f'preflight:\n  disk: {{enabled: false}}\n  network: {{download_urls: ["{base}/big?token=S3KR1T-TOKEN"]}}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_PREFLIGHT_", "HTTP_PROXY", "http_proxy"))}
    env.update(HOME=str(tmp_path), NO_COLOR="1", NO_PROXY="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "invoke", "-f", str(cfg), "bootstrap", "--json", "-"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "S3KR1T-TOKEN" not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    (row,) = doc["measurements"]["downloads"]
    assert row["url"].endswith("/big?token=***") and row["bytes"] == len(BODY) and row["error"] is None
    (result,) = [r for r in doc["results"] if r["id"] == "net-download"]
    assert result["status"] in ("ok", "warn") and result["subject"] == row["url"]
