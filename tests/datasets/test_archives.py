"""Archives: extracted safely; members that escape are refused, links are skipped, never followed."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path
from typing import Literal

import pytest

from datasets.archives import extract, is_archive, stem
from datasets.errors import UsageError


def add(tar: tarfile.TarFile, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def make_tar(path: Path, members: list[tuple[str, bytes, bytes, str]], mode: Literal["w", "w:gz"] = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data, kind, link in members:
            add(tar, name, data, kind, link)
    return path


def test_tar_gz_extracts_files_and_skips_links(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "a.tar.gz",
        [
            ("set/cat/1.jpg", b"one", tarfile.REGTYPE, ""),
            ("set/cat/link.jpg", b"", tarfile.SYMTYPE, "/etc/passwd"),
            ("set/cat/hard.jpg", b"", tarfile.LNKTYPE, "set/cat/1.jpg"),
        ],
    )
    skipped = extract(archive, tmp_path / "out", lambda n: None)
    assert (tmp_path / "out" / "set" / "cat" / "1.jpg").read_bytes() == b"one"
    assert not (tmp_path / "out" / "set" / "cat" / "link.jpg").exists()
    assert [name for name, _ in skipped] == ["set/cat/link.jpg", "set/cat/hard.jpg"]
    assert all("link refused" in reason for _, reason in skipped)


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil.txt", "set/../../evil.txt"])
def test_tar_member_escaping_the_destination_is_refused(tmp_path: Path, name: str) -> None:
    archive = make_tar(tmp_path / "a.tar", [(name, b"pwned", tarfile.REGTYPE, "")], mode="w")
    with pytest.raises(UsageError, match="would land outside the destination"):
        extract(archive, tmp_path / "out", lambda n: None)
    assert not (tmp_path / "evil.txt").exists() and not Path("/etc/evil.txt").exists()


def test_a_file_cannot_be_written_through_an_earlier_link(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    archive = make_tar(
        tmp_path / "a.tar",
        [
            ("d", b"", tarfile.SYMTYPE, str(tmp_path / "outside")),
            ("d/x.txt", b"pwned", tarfile.REGTYPE, ""),
        ],
        mode="w",
    )
    extract(archive, tmp_path / "out", lambda n: None)
    assert not (tmp_path / "outside" / "x.txt").exists()


def test_zip_slip_is_refused_and_normal_zip_extracts(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.zip", tmp_path / "bad.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("set/dog/1.jpg", b"dog")
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../../evil.txt", b"pwned")
    extract(good, tmp_path / "out", lambda n: None)
    assert (tmp_path / "out" / "set" / "dog" / "1.jpg").read_bytes() == b"dog"
    with pytest.raises(UsageError, match="outside the destination"):
        extract(bad, tmp_path / "out2", lambda n: None)


def test_damaged_archive_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x.zip").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(UsageError, match="damaged"):
        extract(tmp_path / "x.zip", tmp_path / "out", lambda n: None)


def test_names() -> None:
    assert is_archive("Data.TAR.GZ") and is_archive("a.tgz") and not is_archive("a.jpg")
    assert stem("imagenet.tar.gz") == "imagenet" and stem("set.zip") == "set"
