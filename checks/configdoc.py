"""The configuration reference, generated from ``templates/defaults.yaml``: its comments are the descriptions.

``python -m checks.configdoc > docs/configuration.md`` rewrites the page; a test fails when the two drift.

How comments are read: a comment block directly above a key (no blank line between) and a comment beside
it describe that key; a comment block directly above a section describes the section; a comment line
``# --- title ---`` starts a group of keys inside a section (its own table). A key no comment describes is an
error (``MissingDescription``): every key gets a description, or the page is not written.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any

import yaml

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")
_GROUP = re.compile(r"^---\s*(?P<title>.*?)\s*---$")
_REGENERATE = "python -m checks.configdoc > docs/configuration.md"

_PREAMBLE = """\
Configuration goes through Invoke's hierarchy. Later sources override earlier ones:

1. `templates/defaults.yaml`: every key, its type (taken from the default) and the source of its value;
2. `/etc/invoke.yaml`;
3. `~/.invoke.yaml`;
4. `invoke.yaml` next to `tasks.py` (in the checkout);
5. `INVOKE_PREFLIGHT_*` environment variables;
6. a file given with `invoke -f FILE TASK`;
7. task flags (`--strict` sets `report.strict`, `--no-bench` sets `bench.enabled: false`).

A file that looks like this configuration but is none of these (an `invoke.yml` in your own project's folder while
tasks.py is found with `invoke -r CHECKOUT`, a `preflight.yaml`) is not read: every task then prints one warning
line on stderr naming it and the files that are read.

All keys live under `preflight`:

```yaml
# invoke.yaml next to tasks.py, or invoke -f my.yaml bootstrap
preflight:
  gpu:
    power_min_fraction: 0.8
  alloc_conf:
    apply: false
    rc_files: ["~/.bash_profile"]
```

An environment variable is `INVOKE_PREFLIGHT_` plus the section and key in capitals:
`INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION=0.8`, `INVOKE_PREFLIGHT_ALLOC_CONF_APPLY=0`. Booleans through the
environment must be `1` or `0` (Invoke would read `false` as true, so gpu-preflight refuses it). Lists
(`alloc_conf.rc_files`, `disk.locations`, `network.download_urls`, ...) can be set only in a file. An unknown key
or variable, or a value of the wrong type, stops every task with exit 2 and names the closest valid key
(`invoke --list` and `--help` still work, so the task names stay readable). A key whose default is an integer takes only integers; one whose default
has a decimal point takes any number; a list takes strings only.
"""


class MissingDescription(ValueError):
    """Keys of the defaults that no comment describes."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"no comment describes {', '.join(keys)}: add one above or beside each in defaults.yaml")


@dataclass(frozen=True)
class Entry:
    """One key or section of the YAML text, with the comments that describe it."""

    path: tuple[str, ...]
    description: str
    section: bool
    group: str


def main() -> None:
    """Print the configuration reference for ``templates/defaults.yaml``."""
    from checks.config import DEFAULTS_FILE

    try:
        page = render(DEFAULTS_FILE.read_text(encoding="utf-8"))
    except MissingDescription as exc:
        raise SystemExit(f"checks.configdoc: {exc}") from None
    sys.stdout.write(page)


def render(text: str) -> str:
    """Return the markdown reference of the YAML ``text``: one table per section (and per group in it)."""
    values = yaml.safe_load(text)
    entries = scan(text)
    _check_keys(entries, values)
    root = entries[0]
    sections = [e for e in entries if e.section and len(e.path) == 2]
    out = [
        "# Configuration\n",
        f"<!-- generated from templates/defaults.yaml by `{_REGENERATE}`: edit the comments there -->\n",
        _PREAMBLE,
        "## Keys\n",
        *([_markdown(root.description) + "\n"] if root.description else []),
        "Sections: " + ", ".join(f"[`{s.path[1]}`](#{s.path[1]})" for s in sections) + ".\n",
    ]
    for section in sections:
        out.append(_section(section, [e for e in entries if e.path[:2] == section.path and not e.section], values))
    return "\n".join(out)


def scan(text: str) -> list[Entry]:
    """Return every key and section of ``text`` in file order, with their descriptions."""
    entries: list[Entry] = []
    parents: list[tuple[int, str]] = []
    above: list[str] = []
    group = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            above = []
        elif stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            title = _GROUP.match(comment)
            group, above = (title["title"], []) if title else (group, [*above, comment])
        else:
            match = _KEY.match(line)
            if match is None:
                raise ValueError(f"defaults line not understood (one key per line): {line!r}")
            indent = len(match["indent"])
            parents = [(i, k) for i, k in parents if i < indent]
            value, beside = _split_comment(match["rest"])
            section = not value.strip()
            group = "" if section else group
            path = (*(k for _, k in parents), match["key"])
            entries.append(Entry(path, " ".join([*above, *([beside] if beside else [])]), section, group))
            parents += [(indent, match["key"])] if section else []
            above = []
    return entries


def _split_comment(rest: str) -> tuple[str, str]:
    """Split ``value  # comment`` at the first ``#`` outside quotes that starts a YAML comment."""
    quote = ""
    for i, char in enumerate(rest):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i], rest[i + 1 :].strip()
    return rest, ""


def _check_keys(entries: list[Entry], values: dict[str, Any]) -> None:
    """Raise when the scan and the YAML loader disagree, or when a key has no description."""
    scanned = {e.path for e in entries if not e.section}
    loaded = set(_leaves(values))
    if scanned != loaded:
        raise ValueError(f"defaults keys the scan missed or invented: {sorted(scanned ^ loaded)}")
    missing = [".".join(e.path[1:]) for e in entries if not e.section and not e.description]
    if missing:
        raise MissingDescription(missing)


def _leaves(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for key, value in values.items():
        path = (*prefix, str(key))
        found += _leaves(value, path) if isinstance(value, dict) and value else [path]  # {}: an open mapping
    return found


def _section(section: Entry, keys: list[Entry], values: dict[str, Any]) -> str:
    """Return a section's heading, its description and a table per group of its keys."""
    out = [f"### {section.path[1]}\n"]
    if section.description:
        out.append(_markdown(section.description) + "\n")
    group: str | None = None
    for entry in keys:
        if entry.group != group:
            heading = f"#### {_markdown(entry.group)}\n\n" if entry.group else ""
            heading = heading if group is None else "\n" + heading
            out.append(heading + "| key | default | type | description |")
            group = entry.group
            out.append("|---|---|---|---|")
        value = _lookup(values, entry.path)
        key = ".".join(entry.path[1:])
        out.append(f"| `{key}` | `{_default(value)}` | {_type(value)} | {_markdown(entry.description)} |")
    return "\n".join(out) + "\n"


def _lookup(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, list)):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def _type(value: Any) -> str:
    # Lists hold strings: config validation accepts nothing else in a list (checks/config.py _type_ok).
    return "list of str" if isinstance(value, list) else type(value).__name__


def _markdown(text: str) -> str:
    """Escape ``|`` (a table cell's end) everywhere and ``<`` (an HTML tag's start) outside code spans."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


if __name__ == "__main__":
    main()
