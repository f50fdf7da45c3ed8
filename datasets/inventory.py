"""Find what a source holds: an ImageFolder tree, a CSV/TSV list of path,label, or .txt/.jsonl text.

Everything comes out sorted, so two scans of the same tree list the same items in the same order, and the
digest (path, size, mtime and label of every input) tells a changed source from an unchanged one.
"""

from __future__ import annotations

import csv
import hashlib
import os
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from datasets.errors import UsageError
from datasets.images import IMAGE_SUFFIXES

LIST_SUFFIXES = (".csv", ".tsv")
TEXT_SUFFIXES = (".txt", ".jsonl")
SPECIAL = "(special file)"  # the key in ``ignored`` of FIFOs, sockets and device nodes: listed, never opened
_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "device"),
    (stat.S_ISBLK, "device"),
)


@dataclass(frozen=True)
class Inventory:
    """The inputs of one staging run, in output order."""

    kind: str  # images | text
    layout: str  # imagefolder | list | text
    root: Path
    paths: tuple[str, ...]  # relative to root (or absolute, from a list)
    labels: tuple[int, ...] = ()
    classes: tuple[str, ...] = ()
    ignored: dict[str, int] = field(default_factory=dict)  # suffix -> files skipped
    digest: str = ""
    total_bytes: int = 0
    specials: tuple[str, ...] = ()  # FIFOs, sockets, device nodes among the files: skipped, never opened

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.paths[i])


@dataclass(frozen=True)
class Columns:
    """Header names of a CSV/TSV list's path and label columns (preflight.stage.path_column, label_column)."""

    path: str
    label: str


def scan(root: Path, kind: str, columns: Columns) -> Inventory:
    """Scan ``root`` (a directory or a list/text file) for ``kind`` (images, text or auto)."""
    if root.is_file():
        return _scan_file(root, kind, columns)
    if not root.is_dir():
        raise UsageError(f"source {root} is neither a file nor a directory")
    lists = sorted(p for p in root.iterdir() if p.suffix.lower() in LIST_SUFFIXES and p.is_file())
    if kind in ("images", "auto") and len(lists) == 1:
        return scan_list(lists[0], columns)
    if kind in ("images", "auto") and _class_dirs(root):
        found = scan_imagefolder(root)
        if found.paths or kind == "images":
            return _non_empty(found)
    if kind in ("text", "auto"):
        found = scan_text(root)
        if found.paths:
            return found
    raise _unknown(root, kind)


def _scan_file(path: Path, kind: str, columns: Columns) -> Inventory:
    suffix = path.suffix.lower()
    if suffix in LIST_SUFFIXES and kind != "text":
        return scan_list(path, columns)
    if suffix in TEXT_SUFFIXES and kind != "images":
        return _finish("text", "text", path.parent, [path.name], [], ())
    raise _unknown(path, kind)


def _unknown(root: Path, kind: str) -> UsageError:
    if root.is_dir() and not _walk_files(root)[0]:
        return UsageError(f"source {root} is empty", hint="point --source at the dataset's top folder")
    if root.is_dir() and kind != "text" and any(p.suffix.lower() in IMAGE_SUFFIXES for p in root.iterdir()):
        return UsageError(
            f"source {root} holds images but no class folders",
            hint="put each class in a folder of its own (ImageFolder), or give a .csv/.tsv list of path,label",
        )
    if root.is_file() and root.suffix.lower() in IMAGE_SUFFIXES:
        return UsageError(
            f"source {root} is one image, not a dataset",
            hint=f"point --source at the folder of class folders it belongs to ({root.parent.parent}?), "
            "or give a .csv/.tsv list of path,label",
        )
    wanted = {
        "images": "images (.jpg, .png, ...) in one folder per class, or a .csv/.tsv list of path,label",
        "text": ".txt or .jsonl files",
    }
    what = wanted.get(kind, wanted["images"] + "; or " + wanted["text"])
    return UsageError(f"unknown format: {root} holds no {what}", hint="see invoke --help stage-data")


def specials_note(inv: Inventory) -> str | None:
    """Return the line that names the special files the scan skipped (None when there were none)."""
    if not inv.specials:
        return None
    named = ", ".join(inv.specials[:3]) + (f" and {len(inv.specials) - 3:,} more" if len(inv.specials) > 3 else "")
    what = "special file" if len(inv.specials) == 1 else "special files"
    return f"skipped {len(inv.specials):,} {what} in {inv.root} (FIFO, socket or device; never opened): {named}"


def _class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def scan_imagefolder(root: Path) -> Inventory:
    """List images under one folder per class (as torchvision's ImageFolder), classes sorted by name."""
    paths: list[str] = []
    labels: list[int] = []
    specials: list[str] = []
    ignored: Counter[str] = Counter()
    classes = tuple(d.name for d in _class_dirs(root))
    for label, name in enumerate(classes):
        files, odd = _walk_files(root / name)
        specials += sorted(f"{name}/{rel}" for rel in odd)
        for rel in sorted(files):
            suffix = os.path.splitext(rel)[1].lower()
            if suffix in IMAGE_SUFFIXES:
                paths.append(f"{name}/{rel}")
                labels.append(label)
            else:
                ignored[suffix or "(no suffix)"] += 1
    found = _finish("images", "imagefolder", root, paths, labels, classes, _count_specials(ignored, specials))
    return replace(found, specials=tuple(specials))


def scan_text(root: Path) -> Inventory:
    """List .txt and .jsonl files under ``root``, sorted by path."""
    paths, ignored = [], Counter[str]()
    files, specials = _walk_files(root)
    for rel in sorted(files):
        suffix = os.path.splitext(rel)[1].lower()
        if suffix in TEXT_SUFFIXES:
            paths.append(rel)
        else:
            ignored[suffix or "(no suffix)"] += 1
    found = _finish("text", "text", root, paths, [], (), _count_specials(ignored, specials))
    return replace(found, specials=tuple(sorted(specials)))


def _count_specials(ignored: Counter[str], specials: list[str]) -> Counter[str]:
    if specials:
        ignored[SPECIAL] += len(specials)
    return ignored


def scan_list(list_file: Path, columns: Columns) -> Inventory:
    """Read a CSV/TSV list of path,label (paths relative to the list's folder), sorted by path."""
    rows = _read_rows(list_file)
    if not rows:
        raise UsageError(f"list {list_file} is empty")
    path_col, label_col, body = _columns(list_file, rows, columns)
    pairs = sorted(
        (row[path_col].strip(), row[label_col].strip()) for row in body if len(row) > max(path_col, label_col)
    )
    if not pairs:
        raise UsageError(f"list {list_file} has no rows with both a path and a label")
    names = [p for p, _ in pairs]
    labels, classes = _labels([lab for _, lab in pairs])
    return _finish("images", "list", list_file.parent, names, labels, classes, Counter(), list_file)


def _read_rows(list_file: Path) -> list[list[str]]:
    delimiter = "\t" if list_file.suffix.lower() == ".tsv" else ","
    try:
        with list_file.open(newline="", encoding="utf-8-sig") as fh:
            return [row for row in csv.reader(fh, delimiter=delimiter) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"cannot read list {list_file}: {exc}") from None


def _columns(list_file: Path, rows: list[list[str]], columns: Columns) -> tuple[int, int, list[list[str]]]:
    """Return (path column, label column, data rows): by header names, or the first two columns without a header."""
    head = [cell.strip() for cell in rows[0]]
    if columns.path in head:
        if columns.label not in head:
            raise UsageError(
                f"list {list_file} has no label column {columns.label!r} (columns: {', '.join(head)})",
                hint="name it with --label-column",
            )
        return head.index(columns.path), head.index(columns.label), rows[1:]
    if len(head) < 2:
        raise UsageError(f"list {list_file} has no label column: rows hold one field", hint="write path,label rows")
    return 0, 1, rows


def _labels(raw: list[str]) -> tuple[list[int], tuple[str, ...]]:
    """Integer labels stay as they are (classes 0..max); names become indices in sorted order."""
    try:
        numbers = [int(x) for x in raw]
    except ValueError:
        classes = tuple(sorted(set(raw)))
        index = {name: i for i, name in enumerate(classes)}
        return [index[x] for x in raw], classes
    if min(numbers) < 0:
        raise UsageError("list labels must be non-negative integers or class names")
    return numbers, tuple(str(i) for i in range(max(numbers) + 1))


def _walk_files(top: Path) -> tuple[list[str], list[str]]:
    """Return (files, special files) not hidden under ``top``, relative to it, following links to folders once.

    A FIFO, socket or device node is a special file: opening a FIFO blocks until something writes to it, so these
    are told apart by the directory entry's type (no extra system call for a plain file) and never opened.
    """
    files: list[str] = []
    specials: list[str] = []
    seen: set[tuple[int, int]] = set()
    pending = [(str(top), "")]
    while pending:
        folder, rel = pending.pop()
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        for entry in _entries(folder):
            name = f"{rel}{entry.name}"
            if entry.is_dir():
                pending.append((entry.path, f"{name}/"))
            elif entry.is_file() or (entry.is_symlink() and not os.path.exists(entry.path)):
                files.append(name)  # a broken link stays an input: decoding rejects it with its reason
            else:
                specials.append(name)
    return files, specials


def _entries(folder: str) -> list[os.DirEntry[str]]:
    """The non-hidden entries of ``folder`` (none when it cannot be listed, as os.walk skips it)."""
    try:
        with os.scandir(folder) as it:
            return [e for e in it if not e.name.startswith(".")]
    except OSError:
        return []


def _non_empty(found: Inventory) -> Inventory:
    if not found.paths:
        raise UsageError(f"source {found.root} has class folders but no images in them")
    return found


def _finish(
    kind: str,
    layout: str,
    root: Path,
    paths: list[str],
    labels: list[int],
    classes: tuple[str, ...],
    ignored: Counter[str] | None = None,
    list_file: Path | None = None,
) -> Inventory:
    """Stat every input into the digest that tells a changed source from an unchanged one."""
    h, total = hashlib.sha256(f"{kind}\0{layout}\0{len(paths)}\0".encode()), 0
    if list_file is not None:
        h.update(list_file.read_bytes())
    for i, rel in enumerate(paths):
        size, mtime, mode = _stat(os.path.join(root, rel))
        if list_file is not None:
            _refuse_special(list_file, rel, mode)
        total += max(size, 0)
        h.update(f"{rel}\0{size}\0{mtime}\0{labels[i] if labels else ''}\n".encode("utf-8", "surrogateescape"))
    return Inventory(
        kind, layout, root, tuple(paths), tuple(labels), classes, dict(ignored or {}), h.hexdigest(), total
    )


def _stat(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1, 0
    return st.st_size, st.st_mtime_ns, st.st_mode


def _refuse_special(list_file: Path, rel: str, mode: int) -> None:
    """A list that names a FIFO, socket or device: refused before anything opens it (a FIFO would block)."""
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            raise UsageError(
                f"list {list_file} names {rel}, a {kind}, not an image file",
                hint="remove it from the list, or point the row at the image itself",
            )
