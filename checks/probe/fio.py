"""fio for the sequential disk figures, when it is installed: the same file size, block size and sync interval
as the built-in test, so the two agree (BENCHMARKS.md compares them side by side).

Write: ``--rw=write --bs=4M --fdatasync=N --end_fsync=1 --fallocate=none`` (fio's bandwidth includes the final
fsync). Read: ``--rw=read --invalidate=1`` (fio drops the file's page cache with posix_fadvise first).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from checks.units import MIB


def fio_available() -> bool:
    """Return True when an ``fio`` binary is on PATH."""
    return shutil.which("fio") is not None


def run_fio(args: list[str], timeout: float) -> dict[str, Any] | None:
    """Run one fio job with JSON output; return its job record, or None when fio failed."""
    try:
        proc = subprocess.run(
            ["fio", "--output-format=json", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        jobs = json.loads(proc.stdout[proc.stdout.find("{") :])["jobs"]
    except (ValueError, KeyError):
        return None
    return jobs[0] if jobs else None


def _common(path: str) -> list[str]:
    return ["--name=gpu-preflight", f"--filename={path}", "--bs=4M", "--ioengine=psync", "--numjobs=1"]


def _rate(job: dict[str, Any], side: str) -> tuple[int, float | None]:
    record = job.get(side, {})
    nbytes, bw = int(record.get("io_bytes", 0)), float(record.get("bw_bytes", 0))
    return nbytes, round(bw / 1e6, 1) if bw > 0 else None


def fio_sequential(scratch: str, cap: int, sync_every: int, write_s: float, read_s: float) -> dict[str, object] | None:
    """Write (fsynced) then cold-read one file in ``scratch`` with fio; None when fio failed."""
    path = os.path.join(scratch, "fio-sequential.bin")
    write_args = [
        *_common(path),
        "--rw=write",
        f"--size={cap}",
        f"--fdatasync={max(1, sync_every)}",
        "--end_fsync=1",
        "--fallocate=none",
        f"--runtime={int(write_s * 1000)}ms",
    ]
    try:
        job = run_fio(write_args, timeout=write_s + 60)
        if job is None:
            return None
        written, write_mb_s = _rate(job, "write")
        size = written // MIB * MIB
        if size <= 0:
            return None
        read_args = [
            *_common(path),
            "--rw=read",
            f"--size={size}",
            "--invalidate=1",
            f"--runtime={int(read_s * 1000)}ms",
        ]
        read_job = run_fio(read_args, timeout=read_s + 60)
        read_mb_s = _rate(read_job, "read")[1] if read_job else None
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {"file_bytes": written, "seq_write_mb_s": write_mb_s, "cold_read_mb_s": read_mb_s}
