"""Scanning sources: ImageFolder, CSV/TSV lists, text; the one-line errors for what cannot work."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from checks.errors import ExitStatus
from datasets.errors import UsageError
from datasets.inventory import Columns, scan
from tests.datasets.jobs import STAGE

CONFIGURED = Columns(path=STAGE.path_column, label=STAGE.label_column)  # path, label


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_imagefolder_is_sorted_and_labelled_by_folder(tmp_path: Path) -> None:
    for rel in ("dog/b.jpg", "dog/a.JPG", "cat/z/deep.png", "cat/y.jpeg", "cat/notes.txt", "cat/.DS_Store"):
        touch(tmp_path / rel)
    inv = scan(tmp_path, "auto", CONFIGURED)
    assert inv.layout == "imagefolder" and inv.classes == ("cat", "dog")
    assert inv.paths == ("cat/y.jpeg", "cat/z/deep.png", "dog/a.JPG", "dog/b.jpg")
    assert inv.labels == (0, 0, 1, 1)
    assert inv.ignored == {".txt": 1}


def test_digest_changes_with_content_and_not_without(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "1.jpg")
    first = scan(tmp_path, "images", CONFIGURED).digest
    assert scan(tmp_path, "images", CONFIGURED).digest == first
    touch(tmp_path / "a" / "1.jpg", b"longer")
    assert scan(tmp_path, "images", CONFIGURED).digest != first


def test_csv_with_header_and_class_names(tmp_path: Path) -> None:
    touch(tmp_path / "img" / "a.jpg")
    touch(tmp_path / "img" / "b.jpg")
    (tmp_path / "list.csv").write_text("file,species\nimg/b.jpg,owl\nimg/a.jpg,cat\n")
    inv = scan(tmp_path / "list.csv", "auto", Columns(path="file", label="species"))
    assert inv.layout == "list" and inv.paths == ("img/a.jpg", "img/b.jpg")
    assert inv.classes == ("cat", "owl") and inv.labels == (0, 1)


def test_tsv_without_header_keeps_integer_labels(tmp_path: Path) -> None:
    touch(tmp_path / "a.jpg")
    (tmp_path / "train.tsv").write_text("a.jpg\t3\n")
    inv = scan(tmp_path, "images", CONFIGURED)
    assert inv.labels == (3,) and inv.classes == ("0", "1", "2", "3")


def test_missing_label_column_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("path,comment\na.jpg,hello\n")
    with pytest.raises(UsageError, match="no label column 'label'") as info:
        scan(tmp_path / "list.csv", "auto", CONFIGURED)
    assert info.value.code == ExitStatus.USAGE


def test_single_column_list_has_no_label_column(tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("a.jpg\nb.jpg\n")
    with pytest.raises(UsageError, match="no label column"):
        scan(tmp_path / "list.csv", "auto", CONFIGURED)


def test_empty_source(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is empty"):
        scan(tmp_path, "auto", CONFIGURED)


def test_unknown_format(tmp_path: Path) -> None:
    touch(tmp_path / "data" / "model.bin")
    with pytest.raises(UsageError, match="unknown format"):
        scan(tmp_path, "auto", CONFIGURED)


def test_one_image_as_the_source_is_named_as_such(tmp_path: Path) -> None:
    touch(tmp_path / "pets" / "cat" / "a.jpg")
    with pytest.raises(UsageError, match=r"a.jpg is one image, not a dataset") as refused:
        scan(tmp_path / "pets" / "cat" / "a.jpg", "auto", CONFIGURED)
    assert f"({tmp_path / 'pets'}?)" in str(refused.value)  # the folder of class folders it likely belongs to


def test_images_without_class_folders(tmp_path: Path) -> None:
    touch(tmp_path / "a.jpg")
    with pytest.raises(UsageError, match="no class folders"):
        scan(tmp_path, "images", CONFIGURED)


def test_text_files_found_when_no_images(tmp_path: Path) -> None:
    touch(tmp_path / "b" / "2.jsonl", b"{}\n")
    touch(tmp_path / "a.txt", b"hello")
    inv = scan(tmp_path, "auto", CONFIGURED)
    assert inv.kind == "text" and inv.paths == ("a.txt", "b/2.jsonl")


def _plant_specials(folder: Path) -> None:
    """A FIFO and a Unix socket named like images: reading either would block or fail, never yield an image."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "pipe.jpg")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock.png"))


def test_special_files_in_a_folder_are_skipped_and_named(tmp_path: Path) -> None:
    touch(tmp_path / "cat" / "a.jpg")
    touch(tmp_path / "dog" / "b.jpg")
    _plant_specials(tmp_path / "cat")
    os.mkfifo(tmp_path / "dog" / "fifo")  # no suffix: a special file all the same, not an "ignored" file
    inv = scan(tmp_path, "auto", CONFIGURED)
    assert inv.paths == ("cat/a.jpg", "dog/b.jpg") and inv.labels == (0, 1)
    assert inv.specials == ("cat/pipe.jpg", "cat/sock.png", "dog/fifo")
    assert inv.ignored == {"(special file)": 3}


def test_special_files_among_text_are_skipped(tmp_path: Path) -> None:
    touch(tmp_path / "a.txt", b"hello")
    os.mkfifo(tmp_path / "b.txt")
    inv = scan(tmp_path, "text", CONFIGURED)
    assert inv.paths == ("a.txt",) and inv.specials == ("b.txt",)


def test_a_list_naming_a_fifo_is_refused_with_its_name(tmp_path: Path) -> None:
    touch(tmp_path / "a.jpg")
    os.mkfifo(tmp_path / "b.jpg")
    (tmp_path / "list.csv").write_text("path,label\na.jpg,0\nb.jpg,1\n")
    with pytest.raises(UsageError, match=r"list .*list\.csv names b\.jpg, a FIFO") as caught:
        scan(tmp_path / "list.csv", "auto", CONFIGURED)
    assert caught.value.code == ExitStatus.USAGE and "remove it from the list" in (caught.value.hint or "")
