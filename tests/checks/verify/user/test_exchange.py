"""The exposed gradient exchange of a torchrun command, by the A/B of re-runs with and without it
(``checks/verify/user/exchange.py``): real torchrun, two gloo ranks, a model whose gradients, not its math, make
the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.verify.user.test_command import TORCHRUN_2, verdict, verify

pytestmark = pytest.mark.slow


def test_a_wide_model_over_gloo_is_comm_bound_by_the_a_b(tmp_path: Path) -> None:
    """64 -> 100,000 -> 4: 6.8 M parameters (27 MB of gradients a step) over 100 kFLOP of math per sample."""
    said: list[str] = []
    judged = verify(
        tmp_path, *TORCHRUN_2, "ddp_gloo.py", "--wide", "100000", steps=6, said=said,
        # time for two runs of each leg (several seconds each here), after the one-process run (solo.py) before them
        verify_cfg={"command_advice_s": 60.0, "budget": 300.0},
    )  # fmt: skip
    m = judged.report.measurements
    ab = m["ddp"]["ab"]
    assert ab is not None, (said, m["time_to_verdict"])
    assert any(line.startswith("verify: timing the gradient exchange by re-runs") for line in said), said
    assert ab["windows"] >= 1 and ab["window_steps"] == 8 and ab["no_sync_median_s"] > 0
    wait = ab["sync_median_s"] - ab["no_sync_median_s"]
    if ab["agreed"]:  # its repeats agreed within verify.exchange_ab_tolerance: its figure is judged
        assert wait > 0  # the step without the exchange is shorter
        assert m["ddp"]["comm_exposed_ms"] == pytest.approx(1000 * wait, abs=0.01)
        assert m["ddp"]["comm_share"] == pytest.approx(wait / ab["sync_median_s"], abs=1e-3)
    else:  # a crowded box (one run of each leg fitted 60 s here, once 122 ms unchanged against 124 ms skipped)
        assert ab["noise"].startswith("too noisy to call") and any(ab["noise"] in line for line in said), said
        assert m["ddp"]["comm_exposed_ms"] > 0
    assert verdict(judged) == "comm-bound", m["diagnosis"]
    assert "model_advice" not in m  # comm-bound: no model-side re-runs (faster math would only wait longer)
    assert m["command"]["processes_left"] == []
