"""The layering of docs/architecture.md, held over the real import graph of the checkout.

The table "What may import what" in docs/architecture.md is the rule; this test parses it, so the document and
the code cannot drift apart. It walks every module of tasks.py, checks/, datasets/ and provision/ with ``ast``
(imports inside functions count too) and fails on: an import the table does not allow (an upward import), a
circle between modules, a third-party hardware library (pynvml, psutil) outside the probe package, a path under
/proc or /sys or the mount table read outside it, and ``sh``, ``fabric`` or ``invoke`` outside the one place each
belongs.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
ROOTS = ("checks", "datasets", "provision")
PROBE = "checks.probe"
# Third-party modules with one home each: the hardware libraries live behind the seam, the shell-command library
# in stage-data's transfer module, SSH in provision/, the CLI framework in tasks.py and the CLI layer under it
# (fabric's Connection is an Invoke Context, so provision/ reaches Invoke through fabric, never by name).
OWNERS = {
    "pynvml": (PROBE,),
    "psutil": (PROBE,),
    "sh": ("datasets.transfer",),
    "fabric": ("provision",),
    "paramiko": ("provision",),
    "invoke": ("tasks", "checks.cli"),
}
PSEUDO_PATH = re.compile(r"^/(proc|sys)(/|$)|mountinfo")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    files = [REPO / "tasks.py"] + [p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))]
    return {module_name(p): p for p in files}


MODULES = project_modules()


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once for all the tests of this file (each walks every module)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def imports_of(path: Path) -> tuple[tuple[str, int], ...]:
    """Every absolute module an import statement in ``path`` names, resolved to a project module where it is one."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from checks.machine import gpu` imports the module checks.machine.gpu
                full = f"{node.module}.{alias.name}"
                found.append((full if full in MODULES else node.module, node.lineno))
    return tuple(found)


def layer_of(module: str, layers: list[str]) -> str | None:
    """The most specific layer (a package prefix or a module) that ``module`` belongs to."""
    found = [name for name in layers if module == name or module.startswith(name + ".")]
    return max(found, key=len) if found else None


def allowed_table() -> dict[str, set[str]]:
    """Rows of the table under "What may import what": ``| `layer` | `a`, `b` |``."""
    text = DOC.read_text()
    section = text.split("## What may import what", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = {c.strip().strip("`") for c in cells[1].split(",") if c.strip()}
    return table


def project_edges() -> Iterator[tuple[str, str, int]]:
    for module, path in MODULES.items():
        for target, line in imports_of(path):
            if target.split(".")[0] in (*ROOTS, "tasks"):
                yield module, target, line


def test_the_table_covers_every_module_and_names_only_real_layers() -> None:
    table = allowed_table()
    layers = list(table)
    assert {"checks", PROBE, "checks.machine", "checks.verify", "datasets", "tasks"} <= set(layers)
    assert [m for m in MODULES if layer_of(m, layers) is None] == []
    assert [name for allowed in table.values() for name in allowed if name not in table] == []


def test_no_module_imports_a_layer_its_row_does_not_allow() -> None:
    table = allowed_table()
    layers = list(table)
    upward = []
    for module, target, line in project_edges():
        mine, theirs = layer_of(module, layers), layer_of(target, layers)
        assert mine is not None and theirs is not None
        if theirs != mine and theirs not in table[mine]:
            upward.append(f"{MODULES[module].relative_to(REPO)}:{line} {module} -> {target}")
    assert upward == []


def find_circle(edges: dict[str, set[str]]) -> list[str]:
    """One circle of the graph as a list of modules (first == last), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_find_circle_finds_one_and_only_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_circle_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for module, target, _ in project_edges():
        if target != module:
            edges.setdefault(module, set()).add(target)
    assert find_circle(edges) == []


@pytest.mark.parametrize("library", sorted(OWNERS))
def test_a_third_party_library_is_imported_only_where_it_belongs(library: str) -> None:
    strays = [
        f"{MODULES[m].relative_to(REPO)}:{line}"
        for m, path in MODULES.items()
        for target, line in imports_of(path)
        if target.split(".")[0] == library and not any(m == o or m.startswith(o + ".") for o in OWNERS[library])
    ]
    assert strays == []


def pseudo_paths(path: Path) -> Iterator[tuple[str, int]]:
    """String constants naming /proc, /sys or the mount table (docstrings and comments do not count)."""
    tree = parsed(path)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        if PSEUDO_PATH.search(node.value) or node.value in ("proc", "sys"):
            yield node.value, node.lineno


def test_only_the_probe_package_reads_proc_sys_and_the_mount_table() -> None:
    readers = [
        f"{path.relative_to(REPO)}:{line} {value!r}"
        for m, path in MODULES.items()
        if not (m == PROBE or m.startswith(PROBE + "."))
        for value, line in pseudo_paths(path)
    ]
    assert readers == []


def test_the_path_scan_sees_a_planted_reader(tmp_path: Path) -> None:
    planted = tmp_path / "leak.py"
    planted.write_text(
        '"""Reads /proc/meminfo (a docstring: not a read)."""\nopen("/proc/self/mountinfo")\nroot / "sys"\n'
    )
    assert [line for _, line in pseudo_paths(planted)] == [2, 3]


# --- the picture at the top of docs/architecture.md ------------------------------------------------------------


def drawn_as(layer: str, layers: list[str]) -> str:
    """How the picture names a layer: its folder (``checks/verify/``); ``checks/*.py`` for a package whose
    subfolders are layers of their own (the core is only the modules directly in it); ``tasks.py`` for a module."""
    path = layer.replace(".", "/")
    if not (REPO / path).is_dir():
        return path + ".py"
    return path + ("/*.py" if any(other.startswith(layer + ".") for other in layers) else "/")


def diagram_problems(doc: str, table: dict[str, set[str]]) -> list[str]:
    """Layers the picture (the first code block of the page) leaves out or draws twice, and imports the table
    allows that the picture does not draw below the importing layer."""
    picture = doc.split("\n## ", 1)[0].split("```", 2)[1].splitlines()
    layers = list(table)
    floor: dict[str, int] = {}
    out = []
    for layer in layers:
        name = re.compile(rf"(?<![\w/]){re.escape(drawn_as(layer, layers))}(?![\w/*])")
        rows = [i for i, line in enumerate(picture) for _ in name.finditer(line)]
        if len(rows) != 1:
            out.append(f"{layer} is drawn {len(rows)} times as {drawn_as(layer, layers)}")
        elif rows:
            floor[layer] = rows[0]
    for layer, allowed in table.items():
        out += [
            f"{layer} may import {other} but is not drawn above it"
            for other in sorted(allowed)
            if layer in floor and other in floor and other != layer and floor[other] <= floor[layer]
        ]
    return out


def test_the_picture_draws_every_layer_above_what_it_may_import() -> None:
    assert diagram_problems(DOC.read_text(), allowed_table()) == []


def test_the_picture_check_sees_a_missing_layer_and_a_wrong_floor() -> None:
    table = {"checks": set(), "checks.probe": {"checks"}, "checks.plan": {"checks", "checks.probe"}}
    doc = "intro\n```\n  checks/probe/\n      |\n  checks/*.py\n```\n## table\n"
    assert diagram_problems(doc, table) == ["checks.plan is drawn 0 times as checks/plan/"]
    upside_down = "intro\n```\n  checks/*.py   checks/plan/\n      |\n  checks/probe/\n```\n"
    assert diagram_problems(upside_down, table) == [
        "checks.probe may import checks but is not drawn above it",
        "checks.plan may import checks but is not drawn above it",  # the same floor is not above
    ]


# --- the maps: docs/architecture.md's rooms and docs/development.md's "where code lives" --------------------------

DEV = REPO / "docs" / "development.md"
CORE_LIMIT = 15  # modules directly in checks/ (with __init__): past it, a subject gets a folder of its own


def rooms(doc: str) -> dict[str, str]:
    """Rows of the table under "The rooms": ``| `checks/verify/` | text |`` -> {"checks/verify/": text}."""
    section = doc.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|", 1)] for line in section.splitlines()]
    return {cells[0].strip("`"): cells[1] for cells in rows if len(cells) == 2 and cells[0].startswith("`")}


def code_map(doc: str) -> dict[str, str]:
    """Entries of the block under "Where code lives": a path at the start of a line, then its text (on that line
    and the indented lines under it) -> {"checks/verify/user/": text}."""
    block = doc.split("## Where code lives", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    heading = ""
    for line in block.splitlines()[1:]:  # the first line is the block's language
        if line[:1].strip():
            heading, _, line = line.partition(" ")
            entries[heading] = ""
        if heading:
            entries[heading] += " " + line.strip()
    return entries


def packages() -> list[str]:
    """Every package folder of the tree (``checks/verify/user/``), and tasks.py."""
    found = [
        str(p.parent.relative_to(REPO)) + "/" for root in ROOTS for p in sorted((REPO / root).rglob("__init__.py"))
    ]
    return ["tasks.py", *found]


def module_files() -> list[str]:
    """Every Python file of the product but packages' ``__init__.py``: modules, child scripts, the injected files."""
    return [str(p.relative_to(REPO)) for p in MODULES.values() if p.name != "__init__.py"]


def named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", text) is not None


def unmapped(entries: dict[str, str], files: list[str]) -> list[str]:
    """Files the map does not name under the entry of their folder: ``checks/verify/user/judge.py`` wants
    ``judge.py`` in the ``checks/verify/user/`` entry, or ``user/judge.py`` in ``checks/verify/``'s when
    ``checks/verify/user/`` has no entry of its own; tasks.py is an entry itself."""
    out = []
    for path in files:
        headings = [h for h in entries if path == h or (h.endswith("/") and path.startswith(h))]
        if not headings:
            out.append(f"{path}: no entry for its folder")
            continue
        heading = max(headings, key=len)
        if path != heading and not named(path[len(heading) :], entries[heading]):
            out.append(f"{path}: not named under {heading}")
    return out


def stale(entries: dict[str, str]) -> list[str]:
    """Entries of a folder that is not there, and ``*.py`` names in an entry that are no file there (a module
    renamed or moved without its map), read from the entry's folder or from the checkout's root."""
    out = []
    for heading, text in entries.items():
        if heading.split("/")[0] not in (*ROOTS, "tasks.py"):
            continue
        if not (REPO / heading).exists():
            out.append(f"{heading}: no such folder")
        base = REPO / heading if heading.endswith("/") else REPO
        out += [
            f"{heading}: {name} is no file"
            for name in re.findall(r"(?<![\w/.*])[\w/]+\.py\b", text)
            if not (base / name).is_file() and not (REPO / name).is_file()
        ]
    return out


def test_every_package_has_a_room_and_every_room_is_a_package() -> None:
    table = rooms(DOC.read_text())
    assert [p for p in packages() if p not in table] == []
    assert [room for room in table if room not in packages()] == []


def test_the_cores_room_names_every_core_module() -> None:
    core = rooms(DOC.read_text())["checks/"]
    assert [p.stem for p in sorted((REPO / "checks").glob("[!_]*.py")) if not named(f"`{p.stem}`", core)] == []


def test_the_code_map_names_every_module_and_nothing_that_is_gone() -> None:
    entries = code_map(DEV.read_text())
    assert unmapped(entries, module_files()) == []
    assert stale(entries) == []


def test_the_map_check_sees_a_missing_module_a_missing_folder_and_a_stale_name() -> None:
    entries = {"tasks.py": " the CLI", "checks/": " config.py gone.py", "checks/verify/": " run.py user/judge.py"}
    files = ["tasks.py", "checks/config.py", "checks/units.py", "checks/verify/run.py", "checks/verify/user/judge.py"]
    assert unmapped(entries, [*files, "datasets/stage.py"]) == [
        "checks/units.py: not named under checks/",
        "datasets/stage.py: no entry for its folder",
    ]
    assert stale(entries) == ["checks/: gone.py is no file"]


def test_the_core_stays_small() -> None:
    assert len(list((REPO / "checks").glob("*.py"))) <= CORE_LIMIT
