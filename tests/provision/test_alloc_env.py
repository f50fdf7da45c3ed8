from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from checks.errors import ExitStatus, PreflightError
from checks.facts import HostFacts, MachineFacts, NvmlFacts, TorchFacts
from provision.alloc_env import (
    BEGIN,
    CREATED,
    END,
    choose_value,
    current_shell,
    ensure_alloc_conf,
    ensure_alloc_conf_removed,
    export_line,
    no_nvidia_gpu,
    render_block,
    variables_for,
)

BOTH = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
USER_TEXT = "# the user's own\nexport EDITOR=vim\n"


@pytest.mark.parametrize(
    ("configured", "torch", "value"),
    [
        ("", "2.13.0+cpu", "expandable_segments:True"),
        ("", "2.1.2+cu121", "max_split_size_mb:64"),
        ("", None, "max_split_size_mb:64"),
        ("garbage_collection_threshold:0.6", "2.13.0", "garbage_collection_threshold:0.6"),
    ],
)
def test_value_by_torch_version(configured: str, torch: str | None, value: str) -> None:
    assert choose_value(configured, torch) == value


def test_variables_by_torch_version() -> None:
    assert variables_for("2.9.1+cu128") == BOTH
    assert variables_for("2.8.0") == ("PYTORCH_CUDA_ALLOC_CONF",)


def test_block_quotes_the_value() -> None:
    block = render_block("a:1, b:2", ("PYTORCH_CUDA_ALLOC_CONF",))
    assert "export PYTORCH_CUDA_ALLOC_CONF='a:1, b:2'" in block
    assert block.startswith(BEGIN) and block.rstrip().endswith(END)


def test_apply_is_idempotent_and_keeps_the_rest(tmp_path: Path) -> None:
    rc = tmp_path / ".bashrc"
    rc.write_text("alias ll='ls -l'\nexport PATH=$HOME/bin:$PATH")  # no trailing newline
    rc.chmod(0o600)
    assert len(ensure_alloc_conf([rc], "expandable_segments:True", BOTH)) == 1
    first = rc.read_bytes()
    assert first.count(BEGIN.encode()) == 1
    assert first.startswith(b"alias ll='ls -l'\nexport PATH=$HOME/bin:$PATH\n")
    assert ensure_alloc_conf([rc], "expandable_segments:True", BOTH) == []
    assert rc.read_bytes() == first
    assert stat.S_IMODE(rc.stat().st_mode) == 0o600


def test_a_new_value_replaces_the_block_in_place(tmp_path: Path) -> None:
    rc = tmp_path / ".profile"
    rc.write_text("before\n")
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    rc.write_text(rc.read_text() + "after\n")
    ensure_alloc_conf([rc], "max_split_size_mb:64", BOTH)
    text = rc.read_text()
    assert text.count(BEGIN) == 1 and "expandable_segments" not in text
    assert text.startswith("before\n") and text.endswith("after\n")


def test_remove_restores_the_file(tmp_path: Path) -> None:
    rc = tmp_path / ".bashrc"
    original = "line one\nline two\n"
    rc.write_text(original)
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    assert len(ensure_alloc_conf_removed([rc])) == 1
    assert rc.read_text() == original
    assert ensure_alloc_conf_removed([rc]) == []


def test_missing_files_are_created_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    rc = tmp_path / "sub" / ".profile"
    changes = ensure_alloc_conf([rc], "expandable_segments:True", BOTH, dry_run=True)
    assert [c.path for c in changes] == [rc] and changes[0].before is None
    assert not rc.exists()
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    assert rc.read_text() == render_block("expandable_segments:True", BOTH, created=True)
    assert ensure_alloc_conf_removed([rc], dry_run=True) and BEGIN in rc.read_text()
    assert list(rc.parent.glob("*.tmp")) == []


def test_removing_from_a_missing_file_is_no_change(tmp_path: Path) -> None:
    assert ensure_alloc_conf_removed([tmp_path / ".bashrc"]) == []
    assert not (tmp_path / ".bashrc").exists()


def test_undo_is_byte_exact_when_the_file_lacked_a_final_newline(tmp_path: Path) -> None:
    rc = tmp_path / ".bashrc"
    for original in ("no newline at the end", "ends with one\n", "two blank lines\n\n"):
        rc.write_text(original)
        ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
        ensure_alloc_conf([rc], "max_split_size_mb:64", BOTH)  # a replacement keeps the joining
        assert rc.read_text().count(BEGIN) == 1
        ensure_alloc_conf_removed([rc])
        assert rc.read_text() == original


def test_undo_deletes_a_file_the_block_created(tmp_path: Path) -> None:
    rc = tmp_path / ".profile"
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    ensure_alloc_conf([rc], "max_split_size_mb:64", BOTH)  # a replacement keeps the mark
    assert CREATED in rc.read_text()
    (change,) = ensure_alloc_conf_removed([rc], dry_run=True)
    assert change.delete and change.after == "" and rc.exists()
    assert [c.path for c in ensure_alloc_conf_removed([rc])] == [rc]
    assert list(tmp_path.iterdir()) == []
    assert ensure_alloc_conf_removed([rc]) == []


@pytest.mark.parametrize("added", ["alias ll='ls -l'\n", "no final newline", "\n"])
def test_undo_keeps_a_created_file_the_user_added_to(tmp_path: Path, added: str) -> None:
    rc = tmp_path / ".profile"
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    rc.write_text(rc.read_text() + added)
    (change,) = ensure_alloc_conf_removed([rc])
    assert not change.delete and rc.read_text() == added


def test_undo_keeps_a_file_that_existed_even_if_empty(tmp_path: Path) -> None:
    rc = tmp_path / ".bashrc"
    rc.write_text("")
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)
    assert CREATED not in rc.read_text()
    ensure_alloc_conf_removed([rc])
    assert rc.exists() and rc.read_text() == ""


def test_a_block_from_an_older_version_is_still_removed(tmp_path: Path) -> None:
    """Blocks written before the created mark existed: the block goes, the file stays."""
    rc = tmp_path / ".profile"
    old = f"{BEGIN}\n# written by `invoke bootstrap` / `invoke alloc-conf`\nexport PYTORCH_CUDA_ALLOC_CONF=x\n{END}\n"
    rc.write_text("mine\n" + old)
    ensure_alloc_conf([rc], "expandable_segments:True", BOTH)  # replaced in place, not marked as created
    assert CREATED not in rc.read_text() and rc.read_text().count(BEGIN) == 1
    ensure_alloc_conf_removed([rc])
    assert rc.read_text() == "mine\n"
    rc.write_text(old)
    (change,) = ensure_alloc_conf_removed([rc])
    assert not change.delete and rc.read_text() == ""


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (NvmlFacts(error="NVML Shared Library Not Found", error_kind="library-not-found"), "no driver library"),
        (NvmlFacts(driver_version="570.124.06"), "NVML sees none"),
        (NvmlFacts(error="Driver Not Loaded", error_kind="driver-not-loaded"), None),  # a GPU behind a broken driver
    ],
    ids=["no-driver", "no-gpu", "broken-driver"],
)
def test_no_nvidia_gpu_only_where_the_cuda_allocator_cannot_run(nvml: NvmlFacts, reason: str | None) -> None:
    found = no_nvidia_gpu(MachineFacts(nvml=nvml, torch=TorchFacts(), host=HostFacts()))
    assert (found is None) if reason is None else (reason in (found or ""))


def test_the_current_shell_line_sets_the_value_when_pasted(tmp_path: Path) -> None:
    value = "expandable_segments:True,garbage_collection_threshold:0.6"
    changes = ensure_alloc_conf([tmp_path / ".bashrc"], value, BOTH)
    line = current_shell(changes, value, BOTH)
    command = line.split("run `", 1)[1].split("`", 1)[0]
    assert command == export_line(value, BOTH) and f"source {tmp_path / '.bashrc'}" in line
    out = subprocess.run(["bash", "--norc", "-c", f"{command}; echo $PYTORCH_CUDA_ALLOC_CONF $PYTORCH_ALLOC_CONF"],
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.split() == [value, value]
    assert current_shell([], value, BOTH) == ""  # nothing written: nothing to say


def test_a_file_that_cannot_be_written_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """A write that fails part-way puts back the files written before it, and names the file with the fix."""
    (tmp_path / "blocker").write_text("a file where a folder would go\n")  # root cannot write through it either
    first, second, third = tmp_path / ".bashrc", tmp_path / "new" / ".profile", tmp_path / "blocker" / ".zshrc"
    first.write_text(USER_TEXT)
    with pytest.raises(PreflightError) as info:
        ensure_alloc_conf([first, second, third], "expandable_segments:True", BOTH)
    assert str(info.value).startswith(f"gpu-preflight: cannot write {third}: ") and "nothing was changed" in str(
        info.value
    )
    assert "rc_files" in str(info.value) and "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in str(
        info.value
    )
    assert info.value.code == ExitStatus.USAGE
    assert first.read_text() == USER_TEXT and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bashrc", "blocker"]  # no temporary siblings
