"""The one Slurm host-list expander and its inverse."""

from __future__ import annotations

import pytest

from checks.errors import PreflightError
from checks.hostlist import compress_nodelist, expand_nodelist


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-[001-003,007],cpu1", ["gpu-001", "gpu-002", "gpu-003", "gpu-007", "cpu1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("single", ["single"]),
    ],
)
def test_expand(text: str, names: list[str]) -> None:
    assert expand_nodelist(text) == names


def test_bad_list_names_its_source() -> None:
    with pytest.raises(PreflightError, match="SLURM_STEP_NODELIST 'gpu-\\[1-' cannot be read"):
        expand_nodelist("gpu-[1-", "SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    ("names", "text"),
    [
        (["gpu-001", "gpu-002", "gpu-003", "gpu-007", "cpu1"], "gpu-[001-003,007],cpu1"),
        (["gpu-017"], "gpu-017"),
        (["login", "n9", "n10"], "login,n9,n10"),  # different widths are different groups
        (["n3", "n1", "n2", "n1"], "n[1-3]"),
    ],
)
def test_compress(names: list[str], text: str) -> None:
    assert compress_nodelist(names) == text


def test_compress_round_trips() -> None:
    names = [f"gpu-{i:03d}" for i in (1, 2, 3, 5, 8, 9, 10, 100)] + ["head"]
    assert sorted(expand_nodelist(compress_nodelist(names))) == sorted(names)
