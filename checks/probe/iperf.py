"""iperf3 for inter-host TCP throughput, where it is installed on both ends (standard library only).

The server is a child of the agent (``checks/probe/tcp.py serve``) and dies with it (PR_SET_PDEATHSIG): a
killed agent leaves no iperf3 behind. A port that is already bound (another iperf3, a daemon) is skipped: the
next of 20 ports is tried. iperf3 3.x takes whole seconds for ``-t`` and ``-O``; the figure is the receiver's
(``end.sum_received``), as with the built-in test.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import shutil
import signal
import subprocess
import time
from typing import Any

PORT_TRIES = 20
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: receive SIGTERM when the agent process dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def iperf3_server(first_port: int) -> tuple[subprocess.Popen[bytes] | None, int | None]:
    """Start ``iperf3 -s`` on the first free port from ``first_port``; (None, None) without iperf3."""
    if shutil.which("iperf3") is None:
        return None, None
    for port in range(first_port, first_port + PORT_TRIES):
        child = subprocess.Popen(
            ["iperf3", "-s", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # the agent starts no threads before this
        )
        time.sleep(0.3)  # a bind failure ("Address already in use") exits at once
        if child.poll() is None:
            return child, port
    return None, None


def iperf3_client(host: str, port: int, streams: int, seconds: float, omit: float, reverse: bool) -> dict[str, Any]:
    """Run ``iperf3 -c`` with JSON output; return the receiver's rate, or {"error": ...}."""
    if shutil.which("iperf3") is None:
        return {"error": "iperf3 is not installed here"}
    duration, skip = max(1, round(seconds)), math.ceil(omit)
    argv = ["iperf3", "-c", host, "-p", str(port), "-t", str(duration), "-O", str(skip), "-P", str(streams), "-J"]
    argv += ["--connect-timeout", "10000"] + (["-R"] if reverse else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + skip + 60, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "iperf3 did not finish in time"}
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return {"error": f"iperf3 exited with {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"}
    if data.get("error"):
        return {"error": f"iperf3: {data['error']}"}
    received = data["end"]["sum_received"]
    return {
        "mbit_s": round(received["bits_per_second"] / 1e6, 1),
        "bytes": int(received["bytes"]),
        "seconds": round(received["seconds"], 3),
        "streams": streams,
        "tool": "iperf3",
    }
