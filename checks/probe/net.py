"""The network part of the seam for one host: downloads from configured URLs, and URL redaction.

Downloads go through an injected ``requests.Session`` (its ``trust_env`` honours HTTP(S)_PROXY and NO_PROXY),
streamed and bounded by bytes and by wall time (a watchdog closes a response that outlives its deadline, so a
server that trickles bytes cannot hold bootstrap). Everything that leaves this module is redacted: userinfo,
query values, fragments and token-like path segments never appear in a report or an error.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from urllib.parse import SplitResult, parse_qsl, quote, urlsplit, urlunsplit

import requests

from checks.facts import DownloadFacts, NetFacts
from checks.units import MIB

CHUNK = 64 * 1024
HIDDEN = "***"
# A path segment this long mixing letters and digits is a token, a signature or a key more often than a name.
TOKEN_LIKE = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9_\-.~+=]{24,}$")


def _netloc(parts: SplitResult) -> str:
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    user = f"{HIDDEN}@" if parts.username or parts.password else ""
    return user + host + port


def looks_secret(segment: str) -> bool:
    """Tell whether a URL path segment reads as a token, a signature or a key rather than a name."""
    return bool(TOKEN_LIKE.match(segment))


def redact(url: str) -> str:
    """Replace the secrets of a URL by ***: credentials, query values, fragment, token-like segments."""
    try:
        parts = urlsplit(url)
        netloc = _netloc(parts)
    except ValueError:
        return HIDDEN
    path = "/".join(HIDDEN if TOKEN_LIKE.match(seg) else seg for seg in parts.path.split("/"))
    query = "&".join(f"{quote(k, safe='')}={HIDDEN}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def secrets_of(url: str) -> list[str]:
    """List the strings of ``url`` that must never be shown, longest first."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [parts.username or "", parts.password or "", parts.query, parts.fragment]
    found += [v for _, v in parse_qsl(parts.query, keep_blank_values=True)]
    found += [seg for seg in parts.path.split("/") if TOKEN_LIKE.match(seg)]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """Remove every secret of ``url`` from ``text`` (an exception message quoting the URL, say)."""
    text = text.replace(url, redact(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN).replace(quote(secret, safe=""), HIDDEN)
    return text


def _abort(response: requests.Response) -> None:
    """Unblock a read stuck on a trickling server: shut the socket down (closing it alone does not wake recv)."""
    raw = response.raw
    sock = getattr(getattr(raw, "connection", None), "sock", None) or getattr(
        getattr(raw, "_connection", None), "sock", None
    )
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()


def _stream(response: requests.Response, max_bytes: int, deadline: float) -> tuple[int, float]:
    """Read the body as it arrives, up to ``max_bytes`` before ``deadline``; return (bytes, seconds)."""
    raw = response.raw
    read = raw.read1 if hasattr(raw, "read1") else raw.read  # read1 (urllib3 2): whatever has arrived
    total, start = 0, time.perf_counter()
    try:
        while total < max_bytes and time.monotonic() < deadline:
            chunk = read(min(CHUNK, max_bytes - total))
            if not chunk:
                break
            total += len(chunk)
    except Exception:  # the watchdog shut the socket down: the time bound, not an error
        if time.monotonic() < deadline:
            raise
    return total, time.perf_counter() - start


def download(url: str, session: requests.Session, max_bytes: int, timeout_s: float) -> DownloadFacts:
    """Fetch ``url`` streamed; latency is request sent -> headers received, throughput counts the body only."""
    shown, start = redact(url), time.perf_counter()
    deadline = time.monotonic() + timeout_s
    headers = {"Accept-Encoding": "identity"}  # count the bytes on the wire, not a decompressed body
    try:
        with session.get(url, stream=True, timeout=(timeout_s, timeout_s), headers=headers) as response:
            latency_ms = round((time.perf_counter() - start) * 1000, 1)
            if response.status_code >= 400:
                error = f"HTTP {response.status_code} {response.reason}"
                return DownloadFacts(shown, latency_ms=latency_ms, status=response.status_code, error=scrub(error, url))
            watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _abort, (response,))
            watchdog.start()
            try:
                got, spent = _stream(response, max_bytes, deadline)
            finally:
                watchdog.cancel()
    except (requests.RequestException, OSError, ValueError) as exc:
        return DownloadFacts(shown, error=scrub(f"{type(exc).__name__}: {exc}", url)[:300])
    mb_s = round(got / spent / 1e6, 2) if spent > 0 and got else None
    return DownloadFacts(shown, mb_s, latency_ms, got, round(spent, 3), response.status_code)


def measure_downloads(
    urls: tuple[str, ...], max_mib: int, timeout_s: float, session: requests.Session | None = None
) -> NetFacts:
    """Download each configured URL once; no URL -> skipped with the reason (nothing is fetched)."""
    if not urls:
        return NetFacts(skipped="no URL configured (preflight.network.download_urls)")
    with session or requests.Session() as http:
        return NetFacts(downloads=tuple(download(u, http, max_mib * MIB, timeout_s) for u in urls))
