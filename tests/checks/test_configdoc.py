"""The configuration reference: generated from templates/defaults.yaml, and docs/configuration.md kept in step."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.config import DEFAULTS_FILE, load_defaults
from checks.configdoc import MissingDescription, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _generated() -> str:
    return render(DEFAULTS_FILE.read_text(encoding="utf-8"))


def _keys(values: dict[str, object], prefix: str = "") -> list[str]:
    found: list[str] = []
    for key, value in values.items():
        found += _keys(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return found


def test_docs_configuration_is_the_generated_text() -> None:
    assert DOC.read_text(encoding="utf-8") == _generated(), (
        "docs/configuration.md is out of date with templates/defaults.yaml: "
        "run `python -m checks.configdoc > docs/configuration.md`"
    )


def test_every_default_key_has_a_row_with_its_default() -> None:
    page = _generated()
    keys = _keys(load_defaults())
    assert len(keys) > 100
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert missing == []
    assert "| `gpu.power_min_fraction` | `0.9` | float | Enforced power limit below this fraction" in page
    assert '| `alloc_conf.rc_files` | `["~/.bashrc", "~/.profile"]` | list of str |' in page


SMALL = """\
# The file's own header.
preflight:
  # What the gpu section judges.
  gpu:
    # Above the key,
    # on two lines.
    power_min_fraction: 0.9
    pcie_fail_fraction: 0.5  # beside the key
    quiet: 3
  verify:
    # --- the loop ---
    steps: 30                # measured steps
    name: "a # b"            # a hash inside quotes is part of the value
"""


def test_comments_above_and_beside_describe_a_key() -> None:
    page = render(SMALL.replace("    quiet: 3\n", ""))
    assert "| `gpu.power_min_fraction` | `0.9` | float | Above the key, on two lines. |" in page
    assert "| `gpu.pcie_fail_fraction` | `0.5` | float | beside the key |" in page
    assert "What the gpu section judges." in page
    assert "The file's own header." in page
    assert "#### the loop\n" in page
    assert '| `verify.name` | `"a # b"` | str | a hash inside quotes is part of the value |' in page


def test_a_key_without_a_comment_is_reported_by_name() -> None:
    with pytest.raises(MissingDescription) as caught:
        render(SMALL)
    assert caught.value.keys == ["gpu.quiet"]
    assert "gpu.quiet" in str(caught.value)


def test_a_comment_above_a_blank_line_describes_nothing() -> None:
    text = SMALL.replace("    quiet: 3\n", "    # orphaned\n\n    quiet: 3\n")
    with pytest.raises(MissingDescription) as caught:
        render(text)
    assert caught.value.keys == ["gpu.quiet"]


def test_table_cells_escape_pipes_and_html_outside_code() -> None:
    text = SMALL.replace("    quiet: 3\n", "    quiet: 3  # a | b goes to <root>, not `<root>`\n")
    assert "| a \\| b goes to &lt;root>, not `<root>` |" in render(text)
