"""Benchmark "model-side advice applied": does the change verify measured on a compute-bound command hold when
the user writes it into the script?

Run from the repository root:  python tests/bench/bench_model_advice.py [--rounds N]
It rewrites the "model-side advice applied" section of BENCHMARKS.md. For each batch size, ``invoke verify --
python conv_net.py`` runs below the CLI (tests/checks/verify/user/scripts/conv_net.py, fp32, CPU) and its
``measurements.model_advice`` is read; then the script and a copy with the advised change written in by hand
(bf16 autocast around the forward pass and the loss, or channels_last) run alternated (before, after, after,
before, ... ``--rounds`` pairs), each timing its own steps with ``time.perf_counter`` (the first 5 left out).
The applied speed-up is the ratio of the two sides' medians; verify's figure is the re-runs' mean-step ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.verify.user.run import CommandRequest, verify_command  # noqa: E402
from tests.bench.benchmarks_md import cpu_machine_line, write_section  # noqa: E402

BEGIN, END = "<!-- bench:model-advice:begin -->", "<!-- bench:model-advice:end -->"
SCRIPT = ROOT / "tests" / "checks" / "verify" / "user" / "scripts" / "conv_net.py"
TIMER = """
import time as _t
_marks = []
_step = optimizer.step
def _timed_step(*a, **k):
    out = _step(*a, **k)
    _marks.append(_t.perf_counter())
    if len(_marks) == STEPS:
        d = [b - a for a, b in zip(_marks[5:], _marks[6:])]
        print("MEDIAN", sorted(d)[len(d) // 2], flush=True)
        raise SystemExit(0)
    return out
optimizer.step = _timed_step
"""


def variant(change: str | None, steps: int) -> str:
    """conv_net.py timing its own steps, with ``change`` written in as a user would write it."""
    src = SCRIPT.read_text()
    src = src.replace("step = 0\n", TIMER.replace("STEPS", str(steps)) + "step = 0\n", 1)
    if change == "bf16":
        src = src.replace(
            "        loss = nn.functional.cross_entropy(model(x), y)",
            "        with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "            loss = nn.functional.cross_entropy(model(x), y)",
        )
    elif change == "channels_last":
        src = src.replace(
            "optimizer = torch.optim", "model = model.to(memory_format=torch.channels_last)\noptimizer = torch.optim"
        )
        src = src.replace("model(x)", "model(x.contiguous(memory_format=torch.channels_last))")
    return src


def median_step(source: str, batch: int, folder: Path) -> float:
    path = folder / "train.py"
    path.write_text(source)
    out = subprocess.run(
        [sys.executable, str(path), "--batch-size", str(batch)], capture_output=True, text=True, check=True
    )
    return float(re.findall(r"MEDIAN (\S+)", out.stdout)[-1])


def verify_advice(batch: int) -> dict[str, Any]:
    request = CommandRequest(
        make_config({}), ("python", SCRIPT.name, "--batch-size", str(batch)), gate=False, quiet=True,
        cwd=str(SCRIPT.parent), json=str(Path(tempfile.mkdtemp()) / "r.json"),
    )  # fmt: skip
    judged = verify_command(request, say=lambda line: None)
    return dict(judged.report.measurements.get("model_advice") or {})


def row(batch: int, rounds: int, steps: int) -> str:
    advice = verify_advice(batch)
    faster = advice.get("faster") or {}
    change = faster.get("change")
    measured = {c["change"]: c.get("speedup") for c in advice.get("candidates", [])}
    shown = ", ".join(f"{k} {v:.2f}x" for k, v in measured.items() if v) or "none timed"
    if change is None:
        return f"| {batch} | {shown} | none advised | - |"
    before: list[float] = []
    after: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            order = [(before, None), (after, change)]
            for side, what in order if i % 2 == 0 else order[::-1]:
                side.append(median_step(variant(what, steps), batch, Path(tmp)))
    applied = statistics.median(before) / statistics.median(after)
    return f"| {batch} | {shown} | {change}: {faster['speedup']:.2f}x | {applied:.2f}x |"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    rows = [row(batch, args.rounds, args.steps) for batch in (8, 32)]
    section = "\n".join(
        [
            BEGIN,
            "## Model-side advice applied (`tests/bench/bench_model_advice.py`)",
            "",
            f"Machine: {cpu_machine_line()}.",
            "",
            "`verify -- python conv_net.py --batch-size B` (a small fp32 conv net on the CPU) and the change it",
            "advised written into the script by hand, timed alternated by the script's own clock (median step,",
            f"{args.rounds} runs a side). Target: the applied speed-up within the box's noise of verify's figure.",
            "",
            "| batch | verify measured | advised | applied by hand |",
            "|---|---|---|---|",
            *rows,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
