"""The one-line GPU projection of a CPU run made of many small ops (``checks.verify.diagnosis.gpu_projection``):
the rule on counted figures, then real scripts under ``verify --``: a 48-block MLP of Linear(64, 64)
(``scripts/tiny_ops.py``) gets it, the small conv net (``scripts/conv_net.py``) and four wide layers
(``scripts/compute_bound.py``) do not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checks.config import make_config
from checks.verify.diagnosis import MANY_OPS, Signals, diagnose, gpu_projection
from tests.checks.verify.user.test_command import verify
from tests.fakes.verdicts import planted

SHARES = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.5, "backward": 0.4, "optimizer": 0.1, "checkpoint": 0.0}


def signals(ops: int | None, flops: int | None, device: str = "cpu") -> Signals:
    return Signals(30, device, dict(SHARES), 0.01, ops_per_step=ops, flops_per_step=flops)


def test_many_small_ops_on_the_cpu_only() -> None:
    p = gpu_projection(signals(398, 37_511_168))  # counted on tiny_ops.py: 48 blocks at batch 32, SGD
    assert p is not None and p["launches_ms"] == pytest.approx(1.99) and p["math_ms"] == pytest.approx(0.0038, abs=1e-4)
    assert p["text"].startswith("on a GPU (estimate): 398 ops per step of 0.094 MFLOP each are at least 1.99 ms")
    assert "likely launch-bound there" in p["text"] and "docs/sources.md#hta" in p["text"]
    assert gpu_projection(signals(77, 2_038_437_888)) is None  # conv_net.py at batch 32: few ops
    assert gpu_projection(signals(5000, 10**12)) is None  # many ops, but large: the math outlasts the launches
    assert gpu_projection(signals(398, 37_511_168, device="cuda")) is None  # on a GPU the kernels are timed
    assert gpu_projection(signals(MANY_OPS - 1, 1000)) is None and gpu_projection(signals(None, 1000)) is None
    (v,) = diagnose(signals(398, 37_511_168), make_config().verify)
    assert v.id == "compute-bound" and "likely launch-bound there" in v.summary and "\n" not in v.summary
    assert v.evidence["gpu_projection"]["ops_per_step"] == 398


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "noted"),
    [(("tiny_ops.py",), True), (("conv_net.py", "--batch-size", "32"), False), (("compute_bound.py",), False)],
)
def test_a_cpu_run_of_tiny_ops_is_projected_launch_bound(tmp_path: Path, script: tuple[str, ...], noted: bool) -> None:
    judged = verify(tmp_path, sys.executable, *script)
    v = planted(judged.verdicts)
    assert v.id == "compute-bound"
    assert ("on a GPU (estimate)" in v.summary) is noted, v.summary
    if noted:
        assert "likely launch-bound there" in v.summary and v.evidence["gpu_projection"]["ops_per_step"] >= MANY_OPS
