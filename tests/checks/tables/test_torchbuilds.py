from __future__ import annotations

import re

import pytest

from checks.tables.torchbuilds import (
    VARIANTS,
    best_variant,
    coverage,
    driver_cuda,
    install_command,
    parse_arch,
    parse_cuda,
)

WHEEL_124 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
WHEEL_128 = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


@pytest.mark.parametrize(
    ("arch_list", "device", "sass", "ptx"),
    [
        (WHEEL_124, (9, 0), ("sm_90",), ()),
        (WHEEL_124, (8, 9), ("sm_80", "sm_86"), ()),  # Ada runs Ampere SASS
        (WHEEL_124, (12, 0), (), ()),  # RTX 5090 on a cu124 wheel: nothing
        (WHEEL_128, (12, 0), ("sm_120",), ()),
        (WHEEL_124, (8, 7), (), ()),  # Jetson Orin: excluded from sm_80/sm_86
        (("sm_90a",), (9, 0), ("sm_90a",), ()),
        (("sm_90a",), (10, 0), (), ()),  # arch-specific code is not forward compatible
        (("sm_80", "compute_90"), (12, 0), (), ("compute_90",)),  # PTX JITs forward
        (("compute_90",), (8, 0), (), ()),  # but never backward
    ],
)
def test_coverage(arch_list: tuple[str, ...], device: tuple[int, int], sass: tuple, ptx: tuple) -> None:
    cov = coverage(arch_list, device)
    assert (cov.sass, cov.ptx) == (sass, ptx)


def test_parse_arch_rejects_garbage() -> None:
    assert parse_arch("sm_120").cc == (12, 0)  # type: ignore[union-attr]
    assert parse_arch("gfx90a") is None


@pytest.mark.parametrize(
    ("devices", "driver", "variant"),
    [
        ([(12, 0)], (12, 8), "cu128"),
        ([(12, 0)], (13, 0), "cu130"),
        ([(12, 0)], (12, 4), None),  # no build for a 5090 runs on a 12.4 driver
        ([(9, 0)], (12, 2), "cu121"),
        ([(7, 0)], (13, 0), "cu126"),  # V100 is gone from cu128 (2.11+) and cu130
        ([(9, 0), (7, 0)], None, "cu126"),
        ([(6, 1)], (12, 8), "cu126"),
    ],
)
def test_best_variant(devices: list[tuple[int, int]], driver: tuple[int, int] | None, variant: str | None) -> None:
    found = best_variant(devices, driver)
    assert (found.name if found else None) == variant


def test_version_parsing() -> None:
    assert driver_cuda(12080) == (12, 8)
    assert driver_cuda(13000) == (13, 0)
    assert driver_cuda(None) is None and driver_cuda(0) is None
    assert parse_cuda("12.6") == (12, 6) and parse_cuda(None) is None


def test_install_command_uses_the_configured_index_or_pytorchs_own() -> None:
    assert (
        install_command("cu128", "https://example.invalid/whl/")
        == "pip install torch --index-url https://example.invalid/whl/cu128"
    )
    assert install_command("cu128", "") == "pip install torch --index-url https://download.pytorch.org/whl/cu128"


@pytest.mark.parametrize("variant", ["cpu", *(v.name for v in VARIANTS)])
def test_install_command_is_pasteable_for_every_build(variant: str) -> None:
    """A real PyTorch wheel index folder, never a placeholder to fill in."""
    command = install_command(variant)
    assert re.fullmatch(r"pip install torch --index-url https://download\.pytorch\.org/whl/(cpu|cu1[1-3]\d)", command)
    assert {v.name for v in VARIANTS} >= {"cu118", "cu121", "cu124", "cu126", "cu128", "cu130"}


def test_install_command_replacing_an_installed_torch_uninstalls_it_first() -> None:
    # pip calls any installed torch "already satisfied", whatever build it is
    assert install_command("cu126", replace=True) == (
        "pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu126"
    )
