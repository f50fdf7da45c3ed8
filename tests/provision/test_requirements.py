"""The dependency list ``--install`` sends to a host, read from pyproject.toml on every supported Python: with
tomllib (3.11+), and without it (3.10 with no tomli installed) by the small reader of that one array."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from provision.venv import project_dependencies, requirements

REPO = Path(__file__).resolve().parents[2]


def toml() -> Any:
    """The standard library's reader, to compare with (3.11+; on 3.10 the comparisons skip, the rest run)."""
    return pytest.importorskip("tomllib")


TRICKY = """\
[build-system]
requires = ["setuptools>=68"]

[project]
name = "x"  # dependencies = ["not-this"]
dependencies = [  # a comment after the bracket
    "invoke>=2.2,<3",   # why: ...
    'fabric>=3.2,<4',
    # "commented-out>=1",
    "numpy>=1.24", "pkg @ https://example.org/p.whl#sha256=ab",
    "escaped \\"quote\\"",
]
readme = "README.md"

[project.optional-dependencies]
test = ["pytest>=8"]

[tool.other]
dependencies = ["not-this-either"]
"""


def test_the_reader_without_tomllib_gives_what_tomllib_gives_for_this_checkout() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert project_dependencies(text) == tuple(toml().loads(text)["project"]["dependencies"])


def test_the_reader_takes_comments_quotes_and_other_tables_as_toml_does() -> None:
    assert project_dependencies(TRICKY) == tuple(toml().loads(TRICKY)["project"]["dependencies"])
    assert project_dependencies('[project]\ndependencies = ["a", "b"]\n') == ("a", "b")


@pytest.mark.parametrize(
    "text", ["[tool.x]\ndependencies = ['a']\n", "[project]\nname = 'x'\n", "[project]\ndependencies = ['a'\n"]
)
def test_the_reader_refuses_a_file_without_the_array(text: str) -> None:
    with pytest.raises(ValueError, match="dependencies"):
        project_dependencies(text)


def test_requirements_on_python_3_10_without_tomli(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = requirements(REPO)
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib raises ModuleNotFoundError, as on 3.10
    monkeypatch.setitem(sys.modules, "tomli", None)
    assert requirements(REPO) == expected and "fabric>=3.2,<4" in expected
