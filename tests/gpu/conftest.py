"""Tests marked ``gpu`` need an NVIDIA GPU and driver; elsewhere they are skipped with the reason NVML gave.

``tests/gpu/acceptance.sh`` runs them (``python -m pytest -m gpu tests/gpu``) on a lent GPU machine. Tests that
also need a CUDA build of torch take the ``cuda_torch`` fixture, which skips with what torch says.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from checks.facts import NvmlFacts
from checks.probe.nvml import read_nvml


@functools.cache
def nvml_facts() -> NvmlFacts:
    """The real NVML read once per session (the tests under test read it again themselves)."""
    return read_nvml()


def no_gpu_reason() -> str | None:
    """Why this machine cannot run a gpu-marked test, or None when NVML lists a GPU."""
    facts = nvml_facts()
    if facts.error:
        return f"needs an NVIDIA GPU and driver: {facts.error}"
    if not facts.gpus:
        return "needs an NVIDIA GPU: NVML lists none"
    return None


@pytest.fixture(autouse=True)
def _gpu_only(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("gpu") is not None:
        reason = no_gpu_reason()
        if reason:
            pytest.skip(reason)


@pytest.fixture
def cuda_torch() -> Any:
    """torch, when this build can use the GPU (a CPU build on a GPU box is skipped, and the summary shows it)."""
    try:
        import torch
    except ImportError as exc:
        pytest.skip(f"needs torch with CUDA: {exc}")
    if not torch.cuda.is_available():
        pytest.skip(f"needs torch with CUDA: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
    return torch
