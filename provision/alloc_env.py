"""Write the CUDA caching-allocator setting into the shell start-up files, idempotently and reversibly.

The setting lives in a marked block; re-running with the same value changes nothing, a new value replaces
the block, ``remove`` takes it out again and gives back the file byte for byte: a file the block created is
deleted again, unless something else was added to it since. Files are rewritten atomically (temporary sibling,
then rename) and keep their permissions; all of them or none: a file that cannot be written (a read-only HOME)
puts back those written before it and is one line naming it, with the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from checks.config import AllocConfig, PreflightConfig
from checks.errors import PreflightError
from checks.facts import AllocFacts, MachineFacts
from checks.fileio import make_folders, remove_empty, write_atomic
from checks.probe import Probe

BEGIN = "# >>> gpu-preflight: allocator settings >>>"
END = "# <<< gpu-preflight: allocator settings <<<"
# When the file did not end in a newline, one is added before the block and the block says so, so that
# removing it gives back the file byte for byte.
JOINED = " (newline added before this block)"
_BLOCK = re.compile(
    r"(?P<sep>\n?)" + re.escape(BEGIN) + r"(?P<joined>[^\n]*)\n.*?" + re.escape(END) + r"\n?", re.DOTALL
)
# A block that created its file says so, so that removing it can delete the file again. Blocks written before
# this line existed lack it: removing them leaves the file, possibly empty, as those versions did.
CREATED = "# created by gpu-preflight: the file did not exist before; the undo deletes it unless you added to it"
_CREATED = re.compile("^" + re.escape(CREATED.split(":")[0]), re.MULTILINE)


_FIX_FILES = "list files you can write in preflight.alloc_conf.rc_files"


def _version(text: str | None) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def choose_value(configured: str, torch_version: str | None) -> str:
    """The allocator value: the configured one, else by torch version.

    expandable_segments needs torch >= 2.2 (axolotl gates it there); older torch gets the seed article's
    max_split_size_mb:64, which fights fragmentation on every version.
    """
    if configured:
        return configured
    return "expandable_segments:True" if _version(torch_version) >= (2, 2) else "max_split_size_mb:64"


def variables_for(torch_version: str | None) -> tuple[str, ...]:
    """Which variables to export; the first is the one the read-back checks.

    PYTORCH_CUDA_ALLOC_CONF always: torch 2.9-2.11 silently ignored expandable_segments given only through
    PYTORCH_ALLOC_CONF (pytorch/pytorch#183387). PYTORCH_ALLOC_CONF too from 2.9, where it is the documented
    name (docs/sources.md#allocator-env-names); the same value in both cannot conflict.
    """
    if _version(torch_version) >= (2, 9):
        return ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    return ("PYTORCH_CUDA_ALLOC_CONF",)


def render_block(value: str, variables: tuple[str, ...], joined: bool = False, created: bool = False) -> str:
    lines = [
        BEGIN + (JOINED if joined else ""),
        "# written by `invoke bootstrap` / `invoke alloc-conf`; remove with `invoke alloc-conf --undo`",
        *([CREATED] if created else []),
    ]
    lines += [f"export {var}={shlex.quote(value)}" for var in variables]
    return "\n".join([*lines, END]) + "\n"


@dataclass(frozen=True)
class Change:
    """What applying (or removing) the block would do to one file."""

    path: Path
    before: str | None  # None: the file does not exist
    after: str
    delete: bool = False  # the file goes away (``after`` is then "")

    @property
    def changed(self) -> bool:
        return self.before != self.after and not (self.before is None and self.after == "")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # a missing file, or a file where one of its folders would be
        return None
    except OSError as exc:
        raise PreflightError(f"cannot read {path}: {exc.strerror or exc}", hint=_FIX_FILES) from None


def plan_apply(path: Path, value: str, variables: tuple[str, ...]) -> Change:
    """Replace an existing marked block in place (keeping how it was joined), or append one."""
    before = _read(path)
    text = before or ""
    found = _BLOCK.search(text)
    if found:
        joined, created = bool(found.group("joined")), _created(found)
        new = found.group("sep") + render_block(value, variables, joined, created)
        after = text[: found.start()] + new + text[found.end() :]
    else:
        joined = bool(text) and not text.endswith("\n")
        after = text + ("\n" if joined else "") + render_block(value, variables, joined, created=before is None)
    return Change(path, before, after)


def _created(found: re.Match[str]) -> bool:
    return _CREATED.search(found.group(0)) is not None


def plan_remove(path: Path) -> Change:
    """Take the block out; drop the newline written before it only if the block says it added one.

    When the block created the file and nothing else is left, the file is deleted.
    """
    before = _read(path)
    text = before or ""
    created = any(_created(found) for found in _BLOCK.finditer(text))

    def cut(found: re.Match[str]) -> str:
        return "" if found.group("joined") else found.group("sep")

    after = _BLOCK.sub(cut, text)
    return Change(path, before, after, delete=created and after == "")


def write(change: Change) -> None:
    """Write atomically, keeping the file's mode; or delete the file when the change says so."""
    if change.delete:
        change.path.unlink(missing_ok=True)
    else:
        write_atomic(change.path, change.after)


def reverted(change: Change) -> Change:
    """The change that puts the file back as it was before ``change``."""
    return Change(change.path, change.after, change.before or "", delete=change.before is None)


def write_all(changes: list[Change], fix: str) -> None:
    """Make every change or none: when a file cannot be written (a read-only HOME, a file where a folder would go),
    put back those written before it, remove the folders made for them, and raise one line naming the file."""
    done: list[Change] = []
    made: list[Path] = []
    for change in changes:
        try:
            made = (make_folders(change.path.parent) if not change.delete else []) + made
            write(change)
        except OSError as exc:
            for back in reversed(done):
                with contextlib.suppress(OSError):  # it was writable a moment ago; nothing more to try
                    write(reverted(back))
            remove_empty(made)
            raise PreflightError(
                f"cannot write {change.path}: {exc.strerror or exc}; nothing was changed", hint=fix
            ) from None
        done.append(change)


def ensure_alloc_conf(paths: list[Path], value: str, variables: tuple[str, ...], dry_run: bool = False) -> list[Change]:
    """Make every file carry the block for ``value``; return the changes (made unless ``dry_run``, all or none)."""
    changes = [c for c in (plan_apply(p, value, variables) for p in paths) if c.changed]
    if not dry_run:
        write_all(changes, f"{_FIX_FILES}, or put `{export_line(value, variables)}` where your jobs start")
    return changes


def ensure_alloc_conf_removed(paths: list[Path], dry_run: bool = False) -> list[Change]:
    """Take the block out of every file; return the changes (made unless ``dry_run``, all or none)."""
    changes = [c for c in (plan_remove(p) for p in paths) if c.changed]
    if not dry_run:
        write_all(changes, "make it writable and run `invoke alloc-conf --undo` again")
    return changes


def rc_paths(cfg: AllocConfig) -> list[Path]:
    """The configured shell start-up files, ``~`` expanded."""
    return [Path(os.path.expanduser(p)) for p in cfg.rc_files]


def diff(change: Change) -> str:
    """The change as a unified diff of the file now and after."""
    before = (change.before or "").splitlines(keepends=True)
    after = change.after.splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, f"{change.path} (now)", f"{change.path} (after)"))


def no_nvidia_gpu(facts: MachineFacts) -> str | None:
    """Why this machine has no NVIDIA GPU for the CUDA allocator to run on, or None when it has one.

    No driver library at all, or NVML up and seeing no GPU. A driver that is installed but broken (not loaded,
    a version mismatch) still has a GPU behind it: the setting is written for when it is fixed.
    """
    if facts.nvml.error_kind == "library-not-found":
        return "no NVIDIA GPU here (no driver library, see driver)"
    if facts.nvml.error is None and not facts.nvml.gpus:
        return "no NVIDIA GPU here (NVML sees none)"
    return None


def export_line(value: str, variables: tuple[str, ...]) -> str:
    """One line that sets the variables in the shell it is pasted into."""
    return "export " + " ".join(f"{var}={shlex.quote(value)}" for var in variables)


def current_shell(changes: list[Change], value: str, variables: tuple[str, ...]) -> str:
    """What the shell the user is in needs after a write: it read its start-up files before it ("" when none)."""
    if not changes:
        return ""
    return (
        f"this shell does not have it yet (new shells do): run `{export_line(value, variables)}`"
        f" or `source {changes[0].path}`"
    )


def alloc_step(
    probe: Probe, facts: MachineFacts, cfg: PreflightConfig, *, dry_run: bool, apply: bool, without_gpu: bool = False
) -> tuple[AllocFacts, list[str], str]:
    """Write the allocator setting and read it back; what it does depends on the run.

    A replayed snapshot writes nothing (the probe says why it cannot read back); a live run without an importable
    torch skips, and so does a machine without an NVIDIA GPU unless ``without_gpu``; ``apply`` false only reads
    back; a dry run writes nothing and returns the diffs as its notes. Returns the read-back facts, the notes the
    report keeps (the diffs, or the files written), and after a write the line saying what to run in the shell
    the user is in ("" otherwise).
    """
    value, variables = choose_value(cfg.alloc_conf.value, facts.torch.version), variables_for(facts.torch.version)
    if not probe.live:
        return probe.alloc(value, variables, cfg), [], ""
    if facts.torch.error:
        return (
            AllocFacts(wanted=value, variable=variables[0], skipped="torch is not importable (see torch-build)"),
            [],
            "",
        )
    if apply and not without_gpu and (reason := no_nvidia_gpu(facts)):
        why = f"{reason}: no CUDA allocator to set, nothing written (preflight.alloc_conf.without_gpu: true or `invoke alloc-conf` writes it)"
        return AllocFacts(wanted=value, variable=variables[0], skipped=why), [], ""
    if not apply:
        return dataclasses.replace(probe.alloc(value, variables, cfg), applied=False), [], ""
    changes = ensure_alloc_conf(rc_paths(cfg.alloc_conf), value, variables, dry_run=dry_run)
    if dry_run:
        skipped = AllocFacts(
            wanted=value, variable=variables[0], skipped="dry run: nothing written, nothing to read back"
        )
        return skipped, [diff(ch) for ch in changes], ""
    written = [f"wrote allocator settings to {ch.path}" for ch in changes]
    return probe.alloc(value, variables, cfg), written, current_shell(changes, value, variables)
