"""``--sha256`` is never ignored: a local file (an archive, a list, a .jsonl) is hashed and checked every run, before
anything is written; a folder or an SSH source, which have no one file to hash, is refused with one line (exit 2)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from checks.errors import ExitStatus
from datasets.errors import StageFailure, UsageError
from datasets.request import Request
from datasets.stage import stage
from tests.datasets import jobs
from tests.fakes.cli import invoke

WRONG = "0" * 64


def request(src: str | Path, dest: Path, sha256: str, **kw: Any) -> Request:
    """16 px, one worker, up to 10 rejects, ``--sha256 sha256``."""
    req = jobs.request(src, dest, images={"size": 16}, **{"max_rejects": "10", "workers": 1, **kw})
    return dataclasses.replace(req, fetch=dataclasses.replace(req.fetch, sha256=sha256))


@pytest.fixture
def archive(photo_tree: Path, tmp_path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(photo_tree, arcname="pets")
    path = tmp_path / "pets.tar.gz"
    path.write_bytes(buf.getvalue())
    return path


def test_a_local_archive_is_checked_against_its_sha256(archive: Path, tmp_path: Path) -> None:
    right = hashlib.sha256(archive.read_bytes()).hexdigest()
    out = tmp_path / "out"
    with pytest.raises(StageFailure, match=rf"sha256 of {archive} is {right}, expected {WRONG}") as info:
        stage(request(archive, out / "ds", WRONG))
    assert info.value.code == ExitStatus.PROBLEMS and not out.exists()  # nothing written
    done = stage(request(archive, out / "ds", right.upper()))  # hex in either case
    assert done.manifest.contents.counts.staged == 72 and os.listdir(out) == ["ds"]
    with pytest.raises(StageFailure, match="expected 0000"):  # checked on a no-op rerun too
        stage(request(archive, out / "ds", WRONG))


def test_a_local_list_file_is_checked_too(source_copy: Path, tmp_path: Path) -> None:
    rows = ["path,label", *(f"src/fish/{p.name},fish" for p in sorted((source_copy / "fish").iterdir()))]
    listing = tmp_path / "list.csv"
    listing.write_text("\n".join(rows) + "\n")
    with pytest.raises(StageFailure, match="expected 0000"):
        stage(request(listing, tmp_path / "ds", WRONG))
    right = hashlib.sha256(listing.read_bytes()).hexdigest()
    assert stage(request(listing, tmp_path / "ds", right)).manifest.contents.counts.staged == 24


@pytest.mark.parametrize("value", ["abc", "g" * 64, "0" * 63])
def test_a_malformed_sha256_is_refused_before_any_work(archive: Path, tmp_path: Path, value: str) -> None:
    with pytest.raises(UsageError, match=rf"--sha256 {value} is not a sha256"):
        stage(request(archive, tmp_path / "ds", value))
    assert not (tmp_path / "ds").exists()


def test_a_folder_with_sha256_is_refused_with_one_line(photo_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--sha256 checks one file .* is a folder") as info:
        stage(request(photo_tree, tmp_path / "ds", WRONG))
    assert info.value.code == ExitStatus.USAGE and not (tmp_path / "ds").exists()


def test_an_ssh_source_with_sha256_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--sha256 checks one file .* is copied over SSH"):
        stage(request("gpu-store:/datasets/pets/", tmp_path / "ds", WRONG))


@pytest.mark.slow
def test_the_cli_refuses_sha256_on_a_folder_with_exit_2(photo_tree: Path, tmp_path: Path) -> None:
    run = invoke(tmp_path, "stage-data", "--source", str(photo_tree), "--dest", str(tmp_path / "ds"), "--sha256", WRONG)
    assert run.code == 2 and run.err.count("\n") == 1 and "--sha256 checks one file" in run.err, run.why()
    assert "Traceback" not in run.err and not (tmp_path / "ds").exists()
