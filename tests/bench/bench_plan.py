"""Accuracy of ``invoke plan``, written to BENCHMARKS.md: ``python tests/bench/bench_plan.py``.

1. Weights, gradients, master and optimizer bytes against parameters counted on a CPU-built model (exact).
2. Measured saved-for-backward bytes of one GPT block (the reference's pre-LN block, bf16, s=128, b=2, h=256,
   a=4, dropout on) against Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) (docs/sources.md#activation-memory),
   both attention paths; and a small CNN against its saved tensors counted by hand.
3. ``accelerate estimate-memory`` side by side, when accelerate is installed.
A GPU comparison against ``torch.cuda.max_memory_allocated()`` needs a lent GPU and is not run here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from checks.plan.memory import Setup, states  # noqa: E402
from checks.plan.model import from_measurement  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402
from tests.checks.plan import plan_models  # noqa: E402

BEGIN, END = "<!-- bench_plan begin -->", "<!-- bench_plan end -->"
SCRIPT = ROOT / "checks" / "plan" / "scripts" / "measure_model.py"
MODELS = Path(plan_models.__file__).resolve().parent


def measure(model: str, shape: list[int], dtype: str = "float", attention: str = "flash") -> dict:
    spec = {"model": f"plan_models:{model}", "user_path": str(MODELS), "input_shape": shape, "input_dtype": dtype,
            "dtype": "bfloat16", "batches": [1, 2], "checkpointing": False, "attention": attention}  # fmt: skip
    out = subprocess.run([sys.executable, str(SCRIPT), json.dumps(spec)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def states_rows() -> list[str]:
    rows = []
    for name, build, shape, dtype in (("GPT", plan_models.gpt, [128], "long"), ("ResNet-50-like", plan_models.resnet50, [3, 224, 224], "float"), ("ViT", plan_models.vit, [3, 32, 32], "float")):  # fmt: skip
        counted = sum(p.numel() for p in build().parameters())
        size = from_measurement(measure(build.__name__, shape, dtype))
        s = states(size, Setup())
        expected = (2 * counted, 2 * counted, 4 * counted, 8 * counted)
        got = (s.weights, s.grads, s.master, s.optimizer)
        rows.append(f"| {name} | {counted:,} | {size.parameters:,} | {'exact' if got == expected else got} |")
    return rows


def block_rows() -> list[str]:
    s, b, h, a = plan_models.GPT_SEQ, 2, plan_models.GPT_HIDDEN, plan_models.GPT_HEADS
    rows = []
    for label, model, formula in (
        ("as written (s x s scores kept)", "gpt_block", s * b * h * (34 + 5 * a * s / h)),
        ("SDPA as a fused kernel saves", "gpt_block_sdpa", s * b * h * 34 + 4 * a * s * b),
    ):
        d = measure(model, [s, h])
        got = d["rows"][1]["saved"]
        rows.append(f"| GPT block, {label} | {got:,} | {formula:,.0f} | {100 * (got / formula - 1):+.1f}% |")
    d = measure("tiny_cnn", [3, 16, 16])
    per = from_measurement(d).activations.per_sample
    rows.append(
        f"| tiny CNN (conv 3->8, ReLU, linear), per sample | {per:,.0f} | {1536 + 4096 + 20:,} (by hand) | {100 * (per / 5652 - 1):+.1f}% |"
    )
    return rows


def main() -> None:
    accelerate = (
        "accelerate is installed, but `accelerate estimate-memory` loads models from the Hugging Face Hub by name "
        "(no network here) and counts weights only"
        if importlib.util.find_spec("accelerate")
        else "skipped: accelerate is not installed in this environment"
    )
    section = "\n".join([
        BEGIN,
        "## invoke plan: accuracy (bench_plan.py)",
        "",
        f"torch {torch.__version__}, measured on the meta device in plan's child, bf16. Model states (mixed-precision "
        "AdamW: 2 + 2 + 4 + 8 B per parameter) against parameters counted on a CPU-built model:",
        "",
        "| model | counted | plan | weights, grads, master, optimizer |",
        "|---|---|---|---|",
        *states_rows(),
        "",
        "Saved-for-backward bytes at batch 2 against the formula (Korthikanti et al. 2022; fused: 34sbh plus a b·a·s fp32 "
        "logsumexp), and a CNN against its saved tensors counted by hand:",
        "",
        "| case | measured B | formula B | difference |",
        "|---|---|---|---|",
        *block_rows(),
        "",
        "The fused row's excess is a layout copy the formula does not know: the attention output is saved as the "
        "kernel returns it and again transposed, as the output projection's input (2sbh = 131,072 B of it).",
        "",
        f"`accelerate estimate-memory` side by side: {accelerate}.",
        "Predicted peak against `torch.cuda.max_memory_allocated()` on a GPU: not run (no GPU lent to this session).",
        END,
    ])  # fmt: skip
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
