"""Put this checkout on a host: rsync over SSH when both ends have it, else a tar stream through the session.

The destination is a directory of its own (``hosts.remote_dir``), marked as gpu-preflight's; a directory that
holds anything else is refused, so ``rsync --delete`` can never empty someone's home. rsync's ssh gets the same
SSH config file fabric read (``-F``), so aliases, keys and ports resolve the same way for both.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from provision.hosts import HostSpec
from provision.remote import MARKER, RemoteError, Session, Stopped, remote_path

EXCLUDES = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".benchmarks",
    "/reports",
    "/build",
    "*.egg-info",
    "/tests",
)
SHIP_TIMEOUT_S = 300.0


def prepare_script(remote_dir: str, python: str) -> str:
    """Write the shell script that checks Python, claims the checkout directory, reports tools and a temp dir."""
    d, py = remote_path(remote_dir), remote_path(python) if "/" in python else shlex.quote(python)
    return "; ".join(
        [
            f"command -v {py} >/dev/null 2>&1 || {{ echo nopython; exit 3; }}",
            f"{py} -c 'import sys; print(\"python %d.%d\" % sys.version_info[:2])' || {{ echo nopython; exit 3; }}",
            f"mkdir -p {d} && cd {d} || exit 5",
            'echo "dir $(pwd -P)"',
            f'[ -z "$(ls -A)" ] || [ -e {MARKER} ] || {{ echo notours; exit 4; }}',
            f"touch {MARKER}",
            "command -v rsync >/dev/null 2>&1 && echo rsync yes || echo rsync no",
            "command -v iperf3 >/dev/null 2>&1 && echo iperf3 yes || echo iperf3 no",
            'echo "tmp $(mktemp -d "${TMPDIR:-/tmp}/gpu-preflight-run.XXXXXX")"',
        ]
    )


def ssh_command(spec: HostSpec, connect_timeout: float, dead_after: float) -> list[str]:
    """Build the ssh argv rsync uses: the same config file as fabric, no prompts, bounded timeouts."""
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={max(1, int(connect_timeout))}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        f"ServerAliveInterval={max(1, int(dead_after // 3))}",
        "-o",
        "ServerAliveCountMax=3",
    ]
    config = Path(os.path.expanduser("~/.ssh/config"))
    if config.is_file():  # ssh looks in the passwd home, fabric in $HOME: make them read the same file
        argv[1:1] = ["-F", str(config)]
    if spec.port:
        argv += ["-p", str(spec.port)]
    if spec.user:
        argv += ["-l", spec.user]
    return argv


def _destination(spec: HostSpec, absolute_dir: str) -> str:
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return f"{host}:{absolute_dir.rstrip('/')}/"


def rsync(session: Session, root: Path, absolute_dir: str, connect_timeout: float, dead_after: float) -> None:
    """Mirror ``root`` into ``absolute_dir`` on the host (interruptible: the stop event kills rsync)."""
    ssh = shlex.join(ssh_command(session.spec, connect_timeout, dead_after))
    argv = [
        "rsync",
        "-a",
        "--delete",
        "-s",
        "--timeout",
        str(max(10, int(dead_after))),
        "-e",
        ssh,
        f"--exclude=/{MARKER}",
        *(f"--exclude={e}" for e in EXCLUDES),
        f"{root}/",
        _destination(session.spec, absolute_dir),
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + SHIP_TIMEOUT_S
    try:
        while proc.poll() is None:
            if session.stop.is_set():
                raise Stopped
            if time.monotonic() > deadline:
                raise RemoteError(f"copying the checkout took longer than {SHIP_TIMEOUT_S:g} s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    if proc.returncode != 0:
        raise RemoteError(f"rsync of the checkout failed ({proc.returncode}): {err.splitlines()[-1] if err else ''}")


def _excluded(name: str) -> bool:
    parts = name.split("/")
    return any(p in EXCLUDES or p.endswith((".pyc", ".egg-info")) for p in parts) or parts[0] in ("tests", "reports")


def tarball(root: Path) -> bytes:
    """Pack the checkout as a gzip'd tar in memory (the same exclusions as rsync)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            name = path.relative_to(root).as_posix()
            if not _excluded(name) and (path.is_file() or path.is_dir()) and not path.is_symlink():
                tar.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def untar(session: Session, root: Path, absolute_dir: str) -> None:
    """Replace the checkout on the host with a tar stream sent through the SSH session (no rsync there)."""
    d = shlex.quote(absolute_dir)
    keep = f"! -name {MARKER} ! -name .venv"  # the marker, and --install's virtualenv (provision/venv.py)
    script = f"cd {d} && find . -mindepth 1 -maxdepth 1 {keep} -exec rm -rf {{}} + && tar -xzf -"
    done = session.run(script, SHIP_TIMEOUT_S, stdin=tarball(root))
    if done.code != 0:
        raise RemoteError(f"copying the checkout (tar) failed: {done.err.strip()[-200:]}")


def ship(session: Session, root: Path, absolute_dir: str, remote_rsync: bool, timeouts: tuple[float, float]) -> str:
    """Copy the checkout; return the method used ("rsync" or "tar")."""
    if remote_rsync and shutil.which("rsync"):
        rsync(session, root, absolute_dir, *timeouts)
        return "rsync"
    untar(session, root, absolute_dir)
    return "tar"
