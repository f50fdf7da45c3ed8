"""What a stage-data run leaves beside its destination: the dataset, a staging folder worth resuming, nothing else.

No `.NAME.lock` after a run ends (finished, refused or failed); nothing at all (no lock, no `staged/` folder, no
line saying where it stages) before the source is known to be reachable; a run refused before any work leaves
nothing for the next run to "resume". URL sources are served by a real HTTP server on loopback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from datasets.errors import StageFailure, UsageError
from datasets.journal import locked
from datasets.request import Request
from datasets.stage import stage
from tests.datasets import jobs
from tests.datasets.servers import Files, http_server


def request(src: str | Path, dest: str | Path, **kw: Any) -> Request:
    """16 px, one worker, up to 10 rejects, no retries, else the configured defaults."""
    req = jobs.request(src, dest, images={"size": 16}, **{"max_rejects": "10", "workers": 1, **kw})
    return dataclasses.replace(req, fetch=dataclasses.replace(req.fetch, retries=0, http_timeout_s=5.0))


def test_a_finished_run_and_its_no_op_rerun_leave_only_the_dataset(photo_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stage(request(photo_tree, out / "ds"))
    assert sorted(os.listdir(out)) == ["ds"]
    assert stage(request(photo_tree, out / "ds")).noop
    assert sorted(os.listdir(out)) == ["ds"]


def test_a_refused_and_a_failed_run_leave_no_lock(photo_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(UsageError, match="not a staged dataset"):
        stage(request(photo_tree, tmp_path / "mine"))
    assert sorted(os.listdir(tmp_path)) == ["mine"]
    with pytest.raises(StageFailure, match="more than --max-rejects"):  # the 5 planted broken files
        stage(request(photo_tree, tmp_path / "ds", max_rejects="0"))
    assert sorted(os.listdir(tmp_path)) == [".ds.staging", "mine"]  # kept: the same command resumes it


def _closed_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_url_without_dest_creates_nothing_and_names_no_disk(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    said: list[str] = []
    req = dataclasses.replace(request(f"http://127.0.0.1:{_closed_port()}/x/pets.tar.gz", ""), dest_roots=(str(root),))
    with pytest.raises(StageFailure, match="cannot reach"):
        stage(req, say=said.append)
    assert said == [] and os.listdir(root) == []


def test_a_missing_file_on_a_real_server_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    said: list[str] = []
    with http_server(Files({})) as base:
        req = dataclasses.replace(request(f"{base}/pets.tar.gz", ""), dest_roots=(str(root),))
        with pytest.raises(StageFailure, match="404"):
            stage(req, say=said.append)
    assert said == [] and os.listdir(root) == []


def test_a_reachable_url_without_dest_names_its_disk_and_leaves_only_the_dataset(
    photo_tree: Path, tmp_path: Path
) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(photo_tree, arcname="pets")
    root = tmp_path / "root"
    root.mkdir()
    said: list[str] = []
    with http_server(Files({"/pets.tar.gz": buf.getvalue()})) as base:
        req = dataclasses.replace(request(f"{base}/pets.tar.gz", ""), dest_roots=(str(root),))
        done = stage(req, say=said.append)
    assert len(said) == 1 and said[0].startswith(f"staging to {root}")
    assert done.dest == root / "staged" / "pets-16px" and os.listdir(root / "staged") == ["pets-16px"]


def _tokenizer(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def test_a_run_refused_for_a_missing_package_leaves_nothing_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("".join(json.dumps({"text": f"hello {i}"}) + "\n" for i in range(5)))
    tok = _tokenizer(tmp_path / "tokenizer.json")
    req = request(tmp_path / "src", tmp_path / "out" / "ds", text={"tokenizer": str(tok)})
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
        with pytest.raises(UsageError, match="needs the tokenizers package"):
            stage(req)
    assert sorted(os.listdir(tmp_path)) == ["src", "tokenizer.json"]  # not even the destination's parent
    done = stage(req)
    assert done.notes == () and done.manifest.contents.counts.staged == 5


def test_the_lock_excludes_a_second_run_and_is_removed_on_release(tmp_path: Path) -> None:
    path = tmp_path / ".ds.lock"
    with locked(path):
        assert path.read_text() == str(os.getpid())
        with pytest.raises(StageFailure, match=rf"another stage-data run \(pid {os.getpid()}\)"), locked(path):
            pass
    assert not path.exists()
    with pytest.raises(RuntimeError), locked(path):
        raise RuntimeError("the run failed")
    assert not path.exists()


def test_a_run_that_opened_the_lock_before_it_was_removed_takes_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classic race of removing a lock file: B opens the file, A finishes (unlinks it), C creates a new one and
    locks it; B's flock then succeeds on the removed file. B must notice and take the file at the path instead."""
    path = tmp_path / ".ds.lock"
    stale = path.with_name("stale")
    stale.write_text("")
    real_open = os.open
    opened: list[str] = []

    def open_stale_first(name: Any, flags: int, mode: int = 0o777) -> int:
        opened.append(str(name))
        return real_open(stale if len(opened) == 1 else name, flags, mode)  # the first open gets a removed file

    monkeypatch.setattr(os, "open", open_stale_first)
    with locked(path):
        assert path.read_text() == str(os.getpid()) and stale.read_text() == ""
    assert opened == [str(path), str(path)] and not path.exists()


def test_dest_in_missing_folders_creates_them_and_a_failed_run_removes_them(photo_tree: Path, tmp_path: Path) -> None:
    """docs/stage-data.md "Where": missing folders above --dest are created, and removed again by a failed run."""
    assert stage(request(photo_tree, tmp_path / "a" / "b" / "ds")).dest == tmp_path / "a" / "b" / "ds"
    with pytest.raises(StageFailure, match="not enough free space"):  # fails after the folders are made
        stage(request(photo_tree, tmp_path / "x" / "y" / "ds", headroom_fraction=1e12))
    assert sorted(os.listdir(tmp_path)) == ["a"]


@pytest.mark.parametrize("under", ["a-file", "a-file/deeper"])
def test_dest_whose_folder_cannot_be_made_is_one_line_exit_2(photo_tree: Path, tmp_path: Path, under: str) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UsageError, match=r"--dest .*/ds: cannot create its folder: .*a-file is a file") as info:
        stage(request(photo_tree, tmp_path / under / "ds"))
    assert info.value.code == 2 and sorted(os.listdir(tmp_path)) == ["a-file"]


def test_dest_in_a_folder_that_cannot_be_written_is_one_line_exit_2(photo_tree: Path, tmp_path: Path) -> None:
    proc = Path("/proc")  # a filesystem nobody can create files in, root included
    with pytest.raises(UsageError, match=r"--dest /proc/ds: cannot write in /proc") as info:
        stage(request(photo_tree, proc / "ds"))
    assert info.value.code == 2
