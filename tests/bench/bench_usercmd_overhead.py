"""Benchmark "verify -- COMMAND overhead": what the agent's hooks cost a training script's own steps.

Run from the repository root:  python tests/bench/bench_usercmd_overhead.py [--pairs N] [--steps N]
It rewrites the "verify -- COMMAND overhead" section of BENCHMARKS.md. The same small training script (a
DataLoader over tensors in memory, an MLP, AdamW, one intra-op thread) times its own steps in CPU time
(``time.process_time``: on a shared box, wall time mostly measures the neighbours) and prints their mean (not
their median: the agent writes its step lines in batches, and the steps that pay for a batch must count). It runs
without and with the injection (the start-up folder first on PYTHONPATH, the agent writing its step lines),
alternated A B B A so drift on a shared box hits both alike. Overhead = the median over the runs with the agent /
the median over the runs without - 1. Target: <= 2% of a ~3.5 ms CPU step. Two sizes: that step, and a step
under 1 ms, where the agent's fixed cost per step shows most.
"""

from __future__ import annotations

import argparse
import contextlib
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
print(statistics.mean(times[10:]))  # the mean: a step that writes the agent's batched lines counts too
"""

# The same loop under the injection, in one process: blocks of steps with the agent's hooks in and with torch's own
# functions put back (``__wrapped__``) and the global optimizer hooks taken out, alternated; what each block costs
# per step, on average. One process, so the run-to-run spread of the first table (memory layout, the neighbours'
# load) is not in the difference; what it leaves out is only what a process pays once (the import hook).
PAIRED = SCRIPT.replace("print(statistics.mean(times[10:]))", "")
PAIRED += """
import torch.optim.optimizer as optimizer
from torch.utils.data import dataloader
hooks = (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks))
spots = [(torch.Tensor, "backward"), (torch.autograd, "backward"), (dataloader._BaseDataLoaderIter, "__next__")]
theirs = [getattr(owner, name) for owner, name in spots]
assert all(hasattr(f, "__wrapped__") for f in theirs), "not under the injection"


def hooked(on):
    for (owner, name), f in zip(spots, theirs):
        setattr(owner, name, f if on else f.__wrapped__)
    for table, kept in zip((optimizer._global_optimizer_pre_hooks, optimizer._global_optimizer_post_hooks), hooks):
        table.clear()
        table.update(kept if on else {})


def block(n):
    out, it, t = [], iter(loader), time.process_time()
    while len(out) < n:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.process_time()
        out.append(now - t)
        t = now
    return statistics.mean(out[5:])


blocks = int(sys.argv[4])
means = {True: [], False: []}
for b in range(blocks):
    for on in ((False, True) if b % 2 == 0 else (True, False)):
        hooked(on)
        means[on].append(block(steps))
print(statistics.median(means[False]), statistics.median(means[True]))
"""

SIZES = (("small step", 448, 64), ("tiny step", 128, 32))  # ~3.5 ms and ~0.75 ms of CPU on a quiet 2-core box


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


def paired(script: Path, width: int, batch: int, steps: int, blocks: int) -> tuple[float, float]:
    """Median over blocks of the mean step without and with the hooks, in one injected process."""
    with tempfile.TemporaryDirectory(prefix="bench-usercmd-") as tmp:
        folder = Path(tmp)
        _stage(folder)
        out = subprocess.run(
            [sys.executable, str(script), str(width), str(batch), str(steps), str(blocks)],
            env=environment(folder, None),
            capture_output=True,
            text=True,
            check=True,
        )
    without, with_ = out.stdout.split()
    return float(without), float(with_)


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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the architecture."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=20, help="blocks of --steps steps each way in the one-process run")
    args = ap.parse_args()
    rows = []
    in_one = []
    with tempfile.TemporaryDirectory() as tmp:
        script, alternated = Path(tmp) / "train.py", Path(tmp) / "paired.py"
        script.write_text(SCRIPT, encoding="utf-8")
        alternated.write_text(PAIRED, encoding="utf-8")
        for name, width, batch in SIZES:
            a, b = paired(alternated, width, batch, args.steps, args.blocks)
            in_one.append((name, width, batch, a, b, b / a - 1))
            print(name, "one process", a, b, file=sys.stderr)
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
        f"(process time: mean of {args.steps} steps, the first 10 left out; one intra-op thread), without and with the "
        f"injection, alternated A B B A, {args.pairs} runs each. Target: <= 2% of a ~3.5 ms CPU step (the small step).",
        "",
        "| script | step without (median of runs) | with the agent | overhead | runs without / with (ms) |",
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
        f"The same loop in one process under the injection, {args.blocks} blocks of {args.steps} steps each way "
        "alternated (hooks in; torch's own functions put back and the global optimizer hooks out), median over the "
        "blocks of their mean step: the run-to-run spread above is not in this difference.",
        "",
        "| script | step without the hooks | with them | overhead |",
        "|---|---|---|---|",
    ]
    for name, width, batch, a, b, over in in_one:
        lines.append(
            f"| {name} (MLP width {width}, batch {batch}) | {a * 1e3:.3f} ms | {b * 1e3:.3f} ms | "
            f"{100 * over:+.1f}% ({(b - a) * 1e6:+.0f} µs) |"
        )
    lines += [
        "",
        f"The agent's own cost per step, timed alone in one process (a `__next__`, a `backward` and an optimizer "
        f"step's hooks around nothing, and the step's JSON line): {cost * 1e6:.0f} µs of CPU, "
        + ", ".join(f"{100 * cost / r[3]:.1f}% of the {r[0]}" for r in rows)
        + ". A difference between the two columns smaller than the spread between runs of one side is noise.",
        "",
        f"Machine: {cpu_model()}, {len(os.sched_getaffinity(0))} usable cores, "
        f"Python {platform.python_version()}; load average {load:.1f} at the end (a box shared with other jobs).",
        END,
    ]
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
