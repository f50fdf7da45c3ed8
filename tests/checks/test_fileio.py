from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checks.errors import ExitStatus, PreflightError, SnapshotError
from checks.fileio import make_folders, read_text, remove_empty, write_atomic


def test_new_file_gets_0644_and_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "report.json"
    write_atomic(path, "one")
    assert path.read_text() == "one" and stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o600)
    write_atomic(path, "two")
    assert path.read_text() == "two" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    path.write_text("complete old report")

    def no_rename(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "half")
    assert path.read_text() == "complete old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_file_the_user_named_is_read_or_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    good = tmp_path / "hosts"
    good.write_text("h1 slots=2\n")
    assert read_text(good, "hosts file") == "h1 slots=2\n"
    binary = tmp_path / "lock.bin"
    binary.write_bytes(b"\xff\xfe\x00torch")
    cases = [
        (tmp_path / "nope", SnapshotError, "machine snapshot {} does not exist (record one)"),
        (binary, PreflightError, "machine snapshot {} is not UTF-8 text"),
        (tmp_path, PreflightError, "machine snapshot {} cannot be read: Is a directory"),
    ]
    for path, error, words in cases:
        with pytest.raises(error) as info:
            read_text(path, "machine snapshot", "record one", error)
        assert info.value.message == "gpu-preflight: " + words.format(path), info.value.message
        assert info.value.code == ExitStatus.USAGE


def test_the_folders_a_run_makes_are_removed_while_empty_and_kept_once_used(tmp_path: Path) -> None:
    made = make_folders(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]  # deepest first, only new
    (tmp_path / "a" / "b" / "kept").write_text("x")  # the run's output (or another run's) in the middle one
    remove_empty(made)
    assert not (tmp_path / "a" / "b" / "c").exists() and (tmp_path / "a" / "b" / "kept").exists()
    assert make_folders(tmp_path / "a" / "b") == []  # nothing new: nothing of the user's is ever removed
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):  # a file in the way: mkdir's own error, for the caller to word
        make_folders(tmp_path / "file" / "sub")
