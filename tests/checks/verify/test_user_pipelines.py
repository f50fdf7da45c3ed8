"""Users' own data and models through --dataset/--model: narrow token dtypes, tokens/s, throughput with saves, and
a factory that needs arguments (one usage line, exit 2)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.fakes.builtin import PLUGINS, builtin, config
from tests.fakes.cli import invoke

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dtype", ["int32", "uint16"])
def test_narrow_token_windows_train_the_built_in_text_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _, results, m = builtin(tmp_path, monkeypatch, config(steps=4), dataset=f"{PLUGINS}:tokens_{dtype}", workers=0)
    assert results["verify-loop"].status.value == "ok", results["verify-loop"].summary
    loss = results["verify-loss"].summary  # "loss FIRST -> LAST over N steps (first vs last quarter)"
    first = float(re.match(r"loss (\S+) -> ", loss).group(1))  # type: ignore[union-attr]
    assert abs(first - math.log(256)) < 1.5, loss  # the script's text model starts near uniform over 256 ids
    assert m["tokens_per_s"] == pytest.approx(32 * m["samples_per_s"])


def test_tokens_per_second_with_the_users_model_and_throughput_with_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, results, m = builtin(
        tmp_path,
        monkeypatch,
        config(steps=4),
        dataset=f"{PLUGINS}:tokens_int32",
        model=f"{PLUGINS}:token_model",
        workers=0,
        ckpt_every=2,
    )
    assert m["tokens_per_s"] == pytest.approx(32 * m["samples_per_s"])
    # One save every 2 steps, at the measured save time: the headline is the rate with the saves in it.
    save, step = m["checkpoint"]["save_s"], m["step_time"]["mean_s"]
    batch = 16
    assert m["samples_per_s_with_checkpoints"] == pytest.approx(batch / (step + save / 2))
    assert m["samples_per_s_with_checkpoints"] < m["samples_per_s"]
    throughput = results["verify-throughput"]
    assert throughput.value == pytest.approx(m["samples_per_s_with_checkpoints"], rel=1e-3)
    assert "with a checkpoint every 2 steps" in throughput.summary and "training only" in throughput.summary
    assert "tokens/s" in throughput.summary


def test_a_dataset_factory_that_needs_arguments_exits_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"INVOKE_PREFLIGHT_VERIFY_REPORT_DIR": str(tmp_path / "reports")}
    run = invoke(home, "verify", "--steps", "2", "--dataset", f"{PLUGINS}:photos_from", env=env)
    assert run.code == 2 and "Traceback" not in run.err + run.out, run.why()
    last = run.err.strip().splitlines()[-1]  # after the child's progress lines: one error line
    assert last.startswith(f"gpu-preflight: verify: {PLUGINS}:photos_from() failed: photos_from() missing"), run.why()
    assert "'root'" in last and "takes no arguments" in last and "verify-loop" not in run.out
