"""Whether this CPU does bf16 math natively, read in verify's own process (``checks.probe.env.read_native_bf16``,
``docs/sources.md#cpu-bf16``): x86 ``avx512_bf16`` or ``amx_bf16`` among the ``flags``, Arm ``bf16`` among the
``Features``. Without them the CPU kernels convert bf16 to fp32 and back around fp32 math: a run "in bf16" is
emulated, and its compute-bound verdict is not healthy compute.

``emulated_fix`` words a compute-bound verdict's fix where the model-side re-runs timed ``fp32`` (the script's bf16
autocast turned off by the agent, ``checks/verify/user/modelfix.py``): "fp32 measured N.NNx faster" or "no gain
measured".
"""

from __future__ import annotations

from typing import Any

from checks.probe.env import read_native_bf16


def for_run(device: str, precision: str | None) -> bool | None:
    """The native-bf16 fact where it matters, a CPU run in bf16; None otherwise (not read)."""
    return read_native_bf16() if device == "cpu" and precision == "bf16" else None


def emulated_fix(advice: dict[str, Any], fix: str) -> str:
    """The compute-bound fix with what the fp32 re-run measured, where one did (else ``fix`` unchanged). A faster
    fp32 is already the fix (``fp32 measured N.NNx faster ...``); otherwise the fix says no gain was measured."""
    row = next((r for r in advice.get("candidates", []) if r.get("change") == "fp32"), None)
    if row is None or (advice.get("faster") or {}).get("change") == "fp32":
        return fix
    if row.get("skipped"):
        return f"bf16 is emulated on this CPU; fp32 not timed: {row['skipped']}; {fix}"
    if not row.get("speedup"):
        return f"bf16 is emulated on this CPU; fp32 not measured ({row.get('ended', 'no steps')}); {fix}"
    gain = float(advice.get("min_gain") or 0.0)
    if row["speedup"] >= 1 + gain and not row.get("loss_agrees"):
        return f"bf16 is emulated on this CPU; fp32 measured {row['speedup']:.2f}x faster but moved the loss; {fix}"
    return f"bf16 is emulated on this CPU, yet fp32 measured {row['speedup']:.2f}x: no gain measured; {fix}"
