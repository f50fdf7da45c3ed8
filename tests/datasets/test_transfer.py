"""Real transfers: rsync locally and over a loopback sshd, HTTP with dropped connections, Range resume, sha256."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import requests

from datasets import transfer
from datasets.errors import StageFailure
from datasets.request import Request
from datasets.sources import Fetch
from datasets.stage import stage
from tests.datasets import jobs
from tests.datasets.servers import Files, http_server, sshd

pytestmark = pytest.mark.slow


def request(src: str, dest: Path, **kw: Any) -> Request:
    """32 px, one worker, up to 10 rejects, else the configured defaults."""
    return jobs.request(src, dest, images={"size": 32}, **{"max_rejects": "10", "workers": 1, **kw})


def tar_gz(tree: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tree, arcname="photos")
    return buf.getvalue()


def test_download_resumes_with_range_after_dropped_connections(tmp_path: Path) -> None:
    blob = os.urandom(3 << 20)
    files = Files({"/blob.bin": blob}, drop_after=700_000, drops=3)
    with http_server(files) as base:
        digest = transfer.download(
            requests.Session(),
            f"{base}/blob.bin",
            tmp_path / "blob.bin",
            sha256=hashlib.sha256(blob).hexdigest(),
            retries=5,
            timeout=5,
            progress=lambda n: None,
        )
    assert (tmp_path / "blob.bin").read_bytes() == blob and digest == hashlib.sha256(blob).hexdigest()
    starts = [int(r.removeprefix("bytes=").rstrip("-")) for _, r in files.requests if r]
    assert len(starts) == 3 and 0 < starts[0] < starts[1] < starts[2], files.requests  # resumed, never restarted
    assert [r for _, r in files.requests].count("") == 1
    assert not (tmp_path / "blob.bin.part").exists()


def test_server_without_range_support_restarts_cleanly(tmp_path: Path) -> None:
    blob = os.urandom(1 << 20)
    files = Files({"/b": blob}, drop_after=300_000, drops=1, ranges=False)
    with http_server(files) as base:
        transfer.download(
            requests.Session(), f"{base}/b", tmp_path / "b", sha256="", retries=3, timeout=5, progress=lambda n: None
        )
    assert (tmp_path / "b").read_bytes() == blob


def test_sha256_mismatch_fails_and_discards_the_file(tmp_path: Path) -> None:
    with http_server(Files({"/b": b"abc"})) as base, pytest.raises(StageFailure, match=r"sha256 of .* expected"):
        transfer.download(
            requests.Session(),
            f"{base}/b",
            tmp_path / "b",
            sha256="0" * 64,
            retries=1,
            timeout=5,
            progress=lambda n: None,
        )
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.part").exists()


def test_stage_from_an_http_archive_through_drops_then_noop(photo_tree: Path, tmp_path: Path) -> None:
    blob = tar_gz(photo_tree)
    files = Files({"/sets/photos.tar.gz": blob}, drop_after=len(blob) // 3, drops=2)
    with http_server(files) as base:
        url = f"{base}/sets/photos.tar.gz"
        fetch = Fetch(ssh_command="ssh", retries=4, http_timeout_s=5.0, sha256=hashlib.sha256(blob).hexdigest())
        done = stage(request(url, tmp_path / "ds", fetch=fetch), session=requests.Session())
        again = stage(request(url, tmp_path / "ds", fetch=fetch), session=requests.Session())
    assert done.manifest.contents.counts.staged == 72 and done.manifest.source.scheme == "http"
    assert again.noop


def test_local_rsync_keeps_partials_out_of_final_names_and_resumes(tmp_path: Path) -> None:
    """docs/sources.md#rsync-resume: local-to-local rsync implies --whole-file; our flags resume instead."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(24 << 20))
    args = ["rsync", *transfer.rsync_args(remote=False, ssh_command=""), "--bwlimit=8m"]
    subprocess.run(["timeout", "-s", "INT", "1.5", *args, f"{src}/", f"{dst}/"], capture_output=True)
    assert not (dst / "big.bin").exists(), "a partial file must not sit under its final name"
    partial = dst / transfer.PARTIAL_DIR / "big.bin"
    assert partial.exists() and 0 < partial.stat().st_size < 24 << 20
    stats = subprocess.run(
        ["rsync", *transfer.rsync_args(False, ""), "--stats", f"{src}/", f"{dst}/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    matched = int(re.search(r"Matched data: ([\d,]+)", stats).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert matched > 0, "the partial was thrown away and the whole file re-sent"
    assert (dst / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_stage_with_copy_rsyncs_the_folder_first(photo_tree: Path, tmp_path: Path) -> None:
    fetch = Fetch(ssh_command="ssh", retries=1, http_timeout_s=5.0, copy=True)
    done = stage(request(str(photo_tree), tmp_path / "ds", fetch=fetch))
    assert done.manifest.contents.counts.staged == 72
    assert not (tmp_path / ".ds.staging").exists()


def test_stage_over_ssh_from_a_loopback_sshd(photo_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    with sshd(tmp_path / "keys") as ssh:
        fetch = Fetch(ssh_command=ssh, retries=2, http_timeout_s=5.0)
        first = stage(request(f"127.0.0.1:{photo_tree}", tmp_path / "ds", fetch=fetch))
        again = stage(request(f"127.0.0.1:{photo_tree}", tmp_path / "ds", fetch=fetch))
    assert first.manifest.source.scheme == "ssh" and first.manifest.contents.counts.staged == 72
    assert again.noop


def test_unreachable_ssh_host_fails_with_exit_1(tmp_path: Path) -> None:
    fetch = Fetch(ssh_command="ssh -o BatchMode=yes -o ConnectTimeout=2 -p 1", retries=0, http_timeout_s=5.0)
    with pytest.raises(StageFailure, match=r"cannot list 127\.0\.0\.1:/data"):
        stage(request("127.0.0.1:/data", tmp_path / "ds", fetch=fetch))
