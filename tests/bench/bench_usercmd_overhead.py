"""Benchmark "verify -- COMMAND overhead": what the agent's hooks cost a training script's own steps.

Run from the repository root:  python tests/bench/bench_usercmd_overhead.py [--pairs N] [--steps N]
It rewrites the "verify -- COMMAND overhead" section of BENCHMARKS.md. The same small training script (a
DataLoader over tensors in memory, an MLP, AdamW, one intra-op thread) times its own steps in CPU time
(``time.process_time``: on a shared box, wall time mostly measures the neighbours) and prints their median; it runs without and with the injection (the start-up folder first on PYTHONPATH, the agent writing its
step lines), alternated A B B A so drift on a shared box hits both alike. Overhead = median step with / median
step without - 1, over the runs' medians. Target: <= 2% of step time. Two sizes: a step of a few ms
(the agent's fixed cost per step shows most) and one of tens of ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.verify.user.launch import _stage, environment  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:usercmd-overhead:begin -->", "<!-- bench:usercmd-overhead:end -->"

SCRIPT = """
import statistics, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
width, batch, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = TensorDataset(torch.randn(batch * 64, width), torch.randint(0, 10, (batch * 64,)))
loader = DataLoader(data, batch_size=batch, shuffle=True)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
times = []
while len(times) < steps:
    it = iter(loader)
    t = time.process_time()
    for x, y in it:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.process_time()
        times.append(now - t)
        t = now
        if len(times) >= steps:
            break
print(statistics.median(times[10:]))
"""

SIZES = (("small step", 128, 32), ("larger step", 512, 128))


def one(script: Path, width: int, batch: int, steps: int, injected: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-usercmd-") as tmp:
        folder = Path(tmp)
        if injected:
            _stage(folder)
            env = environment(folder, None)
        else:
            env = dict(os.environ)
        out = subprocess.run(
            [sys.executable, str(script), str(width), str(batch), str(steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        if injected:
            lines = sum(1 for p in (folder / "events").glob("*.jsonl") for _ in p.open())
            assert lines >= steps, f"the agent wrote {lines} lines for {steps} steps"
        return float(out.stdout.strip().splitlines()[-1])


def per_step_cost(cycles: int = 20000) -> float:
    """The agent's own CPU seconds per step, in this process: a data wait, a backward and an optimizer step's
    hooks around nothing, and the step's JSON line written (the fixed cost every step pays)."""
    import torch

    sys.path.insert(0, str(ROOT / "checks" / "verify" / "user" / "inject"))
    import _gpu_preflight_agent as agent

    with tempfile.TemporaryDirectory() as tmp:
        agent._say = agent._Writer(tmp)
        st = agent._Steps(torch)
        batch = (torch.zeros(8, 4), torch.zeros(8))
        t = time.process_time()
        for _ in range(cycles):
            st.enter("data:1")
            st.leave("data:1")
            st.fetched("data:1", batch)
            st.enter("backward")
            st.leave("backward")
            st.begin_step()
            st.end_step()
        return (time.process_time() - t) / cycles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT, encoding="utf-8")
        for name, width, batch in SIZES:
            plain: list[float] = []
            hooked: list[float] = []
            for i in range(args.pairs):
                order = (False, True) if i % 2 == 0 else (True, False)
                for injected in order:
                    (hooked if injected else plain).append(one(script, width, batch, args.steps, injected))
                print(name, i, plain[-1], hooked[-1], file=sys.stderr)
            a, b = statistics.median(plain), statistics.median(hooked)
            rows.append((name, width, batch, a, b, b / a - 1, plain, hooked))
    cost = per_step_cost()
    load = os.getloadavg()[0]
    lines = [
        BEGIN,
        "## verify -- COMMAND overhead (the agent's hooks in the user's script)",
        "",
        f"`python tests/bench/bench_usercmd_overhead.py`: one training script timing its own steps in CPU time "
        f"(process time: median of {args.steps} steps, the first 10 left out; one intra-op thread), without and with the "
        f"injection, alternated A B B A, {args.pairs} runs each. Target: <= 2% of step time.",
        "",
        "| script | median step without | with the agent | overhead | runs without / with (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, width, batch, a, b, over, plain, hooked in rows:
        runs = " ".join(f"{x * 1e3:.2f}" for x in plain) + " / " + " ".join(f"{x * 1e3:.2f}" for x in hooked)
        lines.append(
            f"| {name} (MLP width {width}, batch {batch}) | {a * 1e3:.2f} ms | {b * 1e3:.2f} ms | "
            f"{100 * over:+.1f}% ({(b - a) * 1e6:+.0f} µs) | {runs} |"
        )
    lines += [
        "",
        f"The agent's own cost per step, timed alone in one process (a `__next__`, a `backward` and an optimizer "
        f"step's hooks around nothing, and the step's JSON line): {cost * 1e6:.0f} µs of CPU, "
        + ", ".join(f"{100 * cost / r[3]:.1f}% of the {r[0]}" for r in rows)
        + ". A difference between the two columns smaller than the spread between runs of one side is noise.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores, "
        f"Python {platform.python_version()}; load average {load:.1f} at the end (a box shared with other jobs).",
        END,
    ]
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
