from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from checks.cli.program import check_env_overrides
from checks.config import PreflightConfig, load_defaults, make_config
from checks.errors import ExitStatus, PreflightError


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in tree.items():
        out |= _leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {prefix + k}
    return out


def _view_keys(cls: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        out |= _view_keys(tp, f"{prefix}{f.name}.") if dataclasses.is_dataclass(tp) else {prefix + f.name}
    return out


def test_typed_view_covers_exactly_the_keys_of_defaults_yaml() -> None:
    assert _view_keys(PreflightConfig) == _leaf_keys(load_defaults())


def test_defaults_build_a_typed_view() -> None:
    cfg = make_config()
    assert cfg.gpu.power_min_fraction == 0.9
    assert cfg.alloc_conf.rc_files == ("~/.bashrc", "~/.profile")


def test_override_is_merged_over_defaults() -> None:
    cfg = make_config({"gpu": {"power_min_fraction": 1}})  # an int where a float is expected is fine
    assert cfg.gpu.power_min_fraction == 1.0
    assert cfg.gpu.pcie_fail_fraction == 0.5


def test_unknown_key_names_it_and_suggests_the_closest() -> None:
    with pytest.raises(PreflightError) as info:
        make_config({"gpu": {"power_min_fractoin": 0.8}})
    assert "preflight.gpu.power_min_fractoin" in str(info.value)
    assert "did you mean preflight.gpu.power_min_fraction?" in str(info.value)
    assert info.value.code == ExitStatus.USAGE


def test_unknown_section_suggests_a_section() -> None:
    with pytest.raises(PreflightError, match=r"did you mean preflight\.bench"):
        make_config({"benc": {}})


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"gpu": {"power_min_fraction": "high"}}, "must be a number"),
        ({"bench": {"enabled": 1}}, "must be true/false"),
        ({"bench": {"repeats": 2.5}}, "must be an integer"),
        ({"bench": {"repeats": True}}, "must be an integer"),
        ({"alloc_conf": {"rc_files": "~/.bashrc"}}, "must be a list of strings"),
        ({"alloc_conf": {"rc_files": [1]}}, "must be a list of strings"),
        ({"gpu": 3}, "must be a section"),
    ],
)
def test_wrong_types_are_rejected(override: dict, needle: str) -> None:
    with pytest.raises(PreflightError, match=needle):
        make_config(override)


def test_good_environment_overrides_pass() -> None:
    # the bad ones are tests/checks/test_cli.py's: they stop the program before Invoke casts them
    env = {"INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION": "0.8", "INVOKE_PREFLIGHT_BENCH_ENABLED": "0", "HOME": "/x"}
    check_env_overrides(env, load_defaults())  # raises on any bad one
