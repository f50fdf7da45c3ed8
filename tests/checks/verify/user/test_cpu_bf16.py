"""bf16 on a CPU without native bf16 (``checks/verify/user/cpuflags.py``): the flags read from recorded
``/proc/cpuinfo`` text (``checks.probe.env.native_bf16``), the compute-bound verdict that no longer calls it healthy, the fix that states what an fp32
re-run measured, and a real bf16-autocast script (``scripts/bf16_autocast.py``) under ``verify --``, judged by this
box's own flags, then re-run in fp32 by the agent as on a CPU that emulates bf16."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.config import make_config
from checks.probe import env
from checks.probe.sample import process_tree
from checks.verify.diagnosis import Signals, Verdict, diagnose
from checks.verify.user import cpuflags, modelfix
from checks.verify.user.judge import model_fix
from checks.verify.user.run import CommandRequest, verify_command
from tests.checks.verify.report_schema import SCHEMA, violations
from tests.fakes.verdicts import planted, planted_id

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SHARES = {"data_wait": 0.0, "h2d": 0.0, "forward": 0.5, "backward": 0.4, "optimizer": 0.1, "checkpoint": 0.0}

# First lines of /proc/cpuinfo as each machine writes them (flags cut to the ones around bf16).
CASCADE_LAKE = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16
"""
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: avx2 avx512f avx512bw avx512_bf16 clzero avx512vbmi
"""
ZEN3 = """processor\t: 0
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu avx avx2 fma sha_ni vaes
"""
GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
"""
GRAVITON3 = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp sve asimdfhm sve2 i8mm bf16 svebf16
"""


def test_native_bf16_from_recorded_cpuinfo() -> None:
    assert env.native_bf16(CASCADE_LAKE) is False  # AVX-512 without its bf16 instructions: emulated
    assert env.native_bf16(ZEN3) is False
    assert env.native_bf16(GRAVITON2) is False
    assert env.native_bf16(SAPPHIRE_RAPIDS) is True
    assert env.native_bf16(ZEN4) is True
    assert env.native_bf16(GRAVITON3) is True
    assert env.native_bf16("") is None and env.native_bf16(None) is None
    assert env.native_bf16("flags\t: avx512_bf16x\n") is False  # whole words only


def test_read_from_a_root_and_only_for_a_cpu_run_in_bf16(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(CASCADE_LAKE + "\n" + CASCADE_LAKE)
    assert env.read_native_bf16(tmp_path) is False
    assert env.read_native_bf16(tmp_path / "missing") is None
    assert cpuflags.for_run("cuda", "bf16") is None and cpuflags.for_run("cpu", "fp32") is None


def signals(precision: str, native: bool | None, device: str = "cpu") -> Signals:
    return Signals(30, device, dict(SHARES), 0.1, precision=precision, bf16_native=native)


def test_emulated_bf16_is_not_healthy_compute_and_bf16_is_never_suggested_again() -> None:
    cfg = make_config().verify
    (v,) = diagnose(signals("bf16", False), cfg)
    assert v.id == "compute-bound" and v.severity == "warn" and v.evidence["bf16_native"] is False
    assert "bf16 is emulated on this CPU (no avx512_bf16 or amx_bf16 flag): not healthy compute" in v.summary
    assert "healthy:" not in v.fix and "bf16 autocast," not in v.fix and "train in fp32" in v.fix
    for native in (True, None):  # native, or not read: the rule as it was
        (v,) = diagnose(signals("bf16", native), cfg)
        assert v.severity == "info" and "emulated" not in v.summary and v.fix.startswith("healthy")
        assert "bf16 autocast" not in v.fix  # already bf16: torch.compile and a faster GPU only
    (v,) = diagnose(signals("bf16", False, device="cuda"), cfg)  # a GPU's bf16 is not the CPU's flags
    assert "emulated" not in v.summary


def test_the_fix_states_what_fp32_measured() -> None:
    fp32 = {"change": "fp32", "mean_step_s": 0.05, "speedup": 1.8, "loss_agrees": True}
    advice = {"faster": fp32, "candidates": [fp32], "min_gain": 0.1, "not_timed": [], "change": modelfix.CODE["fp32"],
              "baseline_mean_step_s": 0.09}  # fmt: skip
    text = cpuflags.emulated_fix(advice, model_fix(advice, "rule"))
    assert text.startswith("drop the bf16 autocast on this CPU") and "fp32 measured 1.80x faster" in text
    slow = fp32 | {"speedup": 0.61, "mean_step_s": 0.16}
    advice |= {"faster": None, "candidates": [slow], "change": None}
    text = cpuflags.emulated_fix(advice, model_fix(advice, "rule"))
    assert text.startswith("bf16 is emulated on this CPU, yet fp32 measured 0.61x: no gain measured; ")
    moved = fp32 | {"loss_agrees": False}
    advice |= {"candidates": [moved]}
    assert "fp32 measured 1.80x faster but moved the loss" in cpuflags.emulated_fix(advice, "rule")
    skipped = {"change": "fp32", "ended": "stopped", "skipped": modelfix.NO_AUTOCAST}
    advice |= {"candidates": [skipped]}
    assert cpuflags.emulated_fix(advice, "rule").startswith("bf16 is emulated on this CPU; fp32 not timed: no bf16")
    assert cpuflags.emulated_fix({"candidates": []}, "rule") == "rule"  # no fp32 re-run: the fix as it was
    timed = {"change": "channels_last", "mean_step_s": 0.1, "speedup": 1.0, "loss_agrees": True}
    budget = advice | {"candidates": [timed], "not_timed": ["fp32"]}  # fp32 not timed for the budget: named
    assert "not timed: fp32 (no bf16 autocast: this CPU emulates bf16)" in model_fix(budget, "rule")


def run_bf16(tmp_path: Path) -> tuple[dict[str, Any], Verdict]:
    cfg = make_config({})  # the default verify.command_advice_s: the model-side re-runs are on
    request = CommandRequest(cfg, (sys.executable, "bf16_autocast.py"), json=str(tmp_path / "r.json"), gate=False,
                             quiet=True, cwd=str(SCRIPTS))  # fmt: skip
    before = process_tree(os.getpid())
    judged = verify_command(request, say=lambda line: None)
    assert process_tree(os.getpid()) - before == set()
    doc = json.loads(json.dumps(judged.report.to_json(), default=str))
    assert violations({"results": doc["results"], "measurements": doc["measurements"]}, SCHEMA) == []
    m = judged.report.measurements
    assert planted_id(m) == "compute-bound" and m["run"]["precision"] == "bf16"
    return m, planted(judged.verdicts)


@pytest.mark.slow
def test_a_bf16_autocast_script_judged_by_this_cpus_flags(tmp_path: Path) -> None:
    native = env.native_bf16(Path("/proc/cpuinfo").read_text())
    m, v = run_bf16(tmp_path)
    rows = {r["change"]: r for r in m["model_advice"]["candidates"]}
    assert "bf16" not in rows and "bf16 autocast" not in v.fix  # already bf16: never suggested again
    if native:  # this box (avx512_bf16 here): the rule as it was, no fp32 re-run
        assert "emulated" not in v.summary and "fp32" not in rows and v.severity == "info"
    else:
        assert "bf16 is emulated on this CPU" in v.summary and v.severity == "warn"
        assert "fp32 measured" in v.fix and ("x faster" in v.fix or "no gain measured" in v.fix), v.fix


@pytest.mark.slow
def test_an_emulating_cpu_gets_the_fp32_re_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded Cascade Lake flags in place of this box's: the fp32 re-run is real (the agent turns the
    script's autocast off), its speed-up this CPU's."""
    monkeypatch.setattr(cpuflags, "read_native_bf16", lambda root=Path("/"): env.native_bf16(CASCADE_LAKE))
    m, v = run_bf16(tmp_path)
    advice = m["model_advice"]
    fp32 = advice["candidates"][0]
    assert fp32["change"] == "fp32" and "skipped" not in fp32, advice  # timed first, on the stepped model
    assert fp32["models"] == ["Sequential"] and fp32["loss_agrees"] and fp32["speedup"] > 0
    assert "bf16 is emulated on this CPU (no avx512_bf16 or amx_bf16 flag)" in v.summary and v.severity == "warn"
    if advice["faster"] and advice["faster"]["change"] == "fp32":
        assert v.fix.startswith(modelfix.CODE["fp32"]) and f"fp32 measured {fp32['speedup']:.2f}x faster" in v.fix
    else:
        assert f"fp32 measured {fp32['speedup']:.2f}x: no gain measured" in v.fix, v.fix
    assert "bf16 autocast" not in v.fix
