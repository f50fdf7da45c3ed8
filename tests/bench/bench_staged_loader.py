"""Benchmark: reading a staged folder through templates/staged_dataset.py's ``staged_loader``.

Run from the repository root:  python tests/bench/bench_staged_loader.py [--images N] [--fresh N] [--no-litdata]
It rewrites the "staged loader" section of BENCHMARKS.md; every row comes from one run on the same cores and the
same photos (scikit-image's, re-encoded as ImageNet-size JPEGs by tests/bench/bench_stage.py's helpers).
Targets: staged_loader >= 30x the best plain JPEG DataLoader (0, 1 or 2 workers), also when the
staged Dataset runs at the worker count bootstrap's advice gives; ahead of LitData on pre-decode time and read
rate; the spread of the read rate over >= 10 fresh processes.
LitData is a benchmark-only dependency: it is installed into its own virtualenv (it pulls another torch) the first
time, and its rows say why when that fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from checks.config import make_config  # noqa: E402
from checks.facts import MachineFacts, NvmlFacts, TorchFacts  # noqa: E402
from checks.machine.resources import loader_advice  # noqa: E402
from checks.probe.host import read_host  # noqa: E402
from datasets.decode import usable_cores  # noqa: E402
from tests.bench.bench_stage import (  # noqa: E402
    JpegTree,
    imagenet_like,
    machine_line,
    read_rate,
    stage_cmd,
    staged_dataset,
    write_tree,
)
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:staged-loader:begin -->", "<!-- bench:staged-loader:end -->"
BATCH = 64
VENV = Path.home() / ".cache" / "gpu-preflight-bench" / "litdata-venv"

# One fresh process's read: prints {"rate", "faults_per_batch"}; mode picks the reader.
FRESH = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
import torch
from staged_dataset import StagedImages, staged_loader
mode, root = sys.argv[1], sys.argv[2]
if mode == "dataloader-1-thread":
    torch.set_num_threads(1)
if mode.startswith("dataloader"):
    loader = torch.utils.data.DataLoader(StagedImages(root), batch_size=64, shuffle=True, num_workers=0)
else:
    loader = staged_loader(root, 64, seed=0, workers=int(mode[-1]))
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rates = []
for epoch in range(3):
    f, t, n, b = faults(), time.perf_counter(), 0, 0
    for x, y in loader:
        n, b = n + len(x), b + 1
    rates.append((n / (time.perf_counter() - t), (faults() - f) / b))
print(json.dumps({"rate": max(rates[1:])[0], "faults_per_batch": max(rates[1:])[1], "first": rates[0][0]}))
"""


def staged_rate(root: Path, workers: int, epochs: int = 3) -> float:
    """Samples per second through ``staged_loader`` (batch 64, shuffled), best epoch after a warm-up."""
    make = _template().staged_loader
    best = 0.0
    it = make(root, BATCH, seed=0, workers=workers)
    for epoch in range(epochs + 1):
        t, n = time.perf_counter(), 0
        for images, _ in it:
            n += len(images)
        if epoch:
            best = max(best, n / (time.perf_counter() - t))
    return best


def _template() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("staged_dataset", ROOT / "templates" / "staged_dataset.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def fresh_spread(root: Path, modes: list[str], count: int) -> dict[str, list[dict[str, float]]]:
    """``count`` fresh processes per mode, interleaved so that a busy spell of the machine hits every mode."""
    out: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(count):
        for mode in modes:
            run = subprocess.run(
                [sys.executable, "-c", FRESH, mode, str(root), str(ROOT / "templates")],
                capture_output=True,
                text=True,
                check=True,
            )
            out[mode].append(json.loads(run.stdout))
    return out


def litdata_python(venv: Path) -> tuple[Path | None, str]:
    """The venv's python with litdata importable (installed on first use), or None and why not."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import litdata, PIL; print(litdata.__version__)"]
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode:
            return None, f"cannot create a virtualenv: {made.stderr.strip()[-200:]}"
    if subprocess.run(check, capture_output=True).returncode:
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "litdata", "pillow"], capture_output=True, text=True
        )
        if pip.returncode:
            return None, f"`pip install litdata` failed: {pip.stderr.strip().splitlines()[-1:]}"
    version = subprocess.run(check, capture_output=True, text=True)
    return (python, version.stdout.strip()) if version.returncode == 0 else (None, version.stderr.strip()[-200:])


LITDATA = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import litdata as ld
from datasets.images import Resize, decode_file


def decode(path):
    return {"image": decode_file(path, Resize(256)), "label": 0}


def rate(out, **kw):
    loader = ld.StreamingDataLoader(ld.StreamingDataset(out, shuffle=True), batch_size=64, **kw)
    best = 0.0
    for epoch in range(3):
        t, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["image"])
        if epoch:
            best = max(best, n / (time.perf_counter() - t))
    return best


if __name__ == "__main__":
    src, out, workers = sys.argv[2], sys.argv[3], int(sys.argv[4])
    files = sorted(str(p) for p in __import__("pathlib").Path(src).rglob("*.jpg"))
    t = time.perf_counter()
    ld.optimize(fn=decode, inputs=files, output_dir=out, num_workers=workers, chunk_bytes="64MB", mode="overwrite")
    optimize_s = time.perf_counter() - t
    tuned = max(rate(out, num_workers=w) for w in (0, 1, 2))
    print(json.dumps({"optimize_s": optimize_s, "default": rate(out), "tuned": tuned}))
"""


def litdata_rows(python: Path, src: Path, tmp: Path, workers: int) -> dict[str, float]:
    script = tmp / "litdata_bench.py"  # a file, not -c: optimize's spawned workers import it to find decode()
    script.write_text(LITDATA)
    run = subprocess.run(
        [str(python), str(script), str(ROOT), str(src), str(tmp / "litdata"), str(workers)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def spread_line(runs: list[dict[str, float]]) -> str:
    rates = sorted(r["rate"] for r in runs)
    faults = statistics.median(r["faults_per_batch"] for r in runs)
    slow = sum(1 for r in rates if r < 0.5 * statistics.median(rates))
    return (
        f"min {rates[0]:,.0f}, median {statistics.median(rates):,.0f}, max {rates[-1]:,.0f}; "
        f"{slow} of {len(rates)} under half the median; {faults:,.0f} page faults per batch (median)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1500, help="ImageNet-size JPEGs staged once")
    parser.add_argument("--fresh", type=int, default=12, help="fresh processes per reader for the spread")
    parser.add_argument("--no-litdata", action="store_true", help="skip the LitData rows")
    parser.add_argument("--litdata-venv", type=Path, default=VENV)
    args = parser.parse_args()
    cores = usable_cores()
    cfg = make_config()
    advice = loader_advice(
        MachineFacts(NvmlFacts(error="not read", error_kind="other"), TorchFacts(), read_host()), cfg
    )
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_PREFLIGHT_")}, "HOME": tmp}
        src = write_tree(tmpd / "jpeg", imagenet_like(args.images))
        t = time.perf_counter()
        subprocess.run(stage_cmd(src, tmpd / "staged", cores), cwd=ROOT, env=env, check=True, capture_output=True)
        stage_s = time.perf_counter() - t
        staged = tmpd / "staged"
        jpeg = {w: read_rate(lambda: JpegTree(src), w, epochs=1) for w in (0, 1, 2)}
        ours = {w: staged_rate(staged, w) for w in (0, 1, 2)}
        dl_advice = read_rate(staged_dataset(staged), advice.num_workers)
        dl_main = read_rate(staged_dataset(staged), 0)
        spread = fresh_spread(
            staged, ["staged_loader-0", "staged_loader-1", "dataloader", "dataloader-1-thread"], args.fresh
        )
        lit: dict[str, float] | None = None
        lit_note = "skipped: --no-litdata"
        if not args.no_litdata:
            python, lit_note = litdata_python(args.litdata_venv)
            if python is not None:
                lit = litdata_rows(python, src, tmpd, cores)
                lit_note = f"litdata {lit_note} in its own virtualenv"
    best_jpeg_w = max(jpeg, key=lambda w: jpeg[w])
    best_ours_w = max(ours, key=lambda w: ours[w])
    best = ours[best_ours_w]
    rows = [
        *[
            (f"read: plain JPEG DataLoader, num_workers={w}, samples/s", r, "best" if w == best_jpeg_w else "")
            for w, r in jpeg.items()
        ],
        *[
            (
                f"read: staged_loader, workers={w} (reading threads), samples/s",
                r,
                _vs(r / jpeg[best_jpeg_w], 30, "/ best JPEG"),
            )
            for w, r in ours.items()
        ],
        (
            f"read: staged StagedImages DataLoader at the advice's num_workers={advice.num_workers}, samples/s",
            dl_advice,
            f"staged_loader is {best / dl_advice:.1f}x this",
        ),
        (
            "read: staged StagedImages DataLoader, num_workers=0, samples/s",
            dl_main,
            f"staged_loader is {best / dl_main:.1f}x this",
        ),
        (f"`invoke stage-data` of the {args.images} JPEGs (whole command), s", stage_s, ""),
    ]
    if lit is not None:
        rows += [
            (
                "LitData `optimize` doing the same decode, s",
                lit["optimize_s"],
                _vs(lit["optimize_s"] / stage_s, 1.0, "LitData / stage-data"),
            ),
            (
                "LitData StreamingDataLoader, defaults, samples/s",
                lit["default"],
                _vs(best / lit["default"], 1.0, "staged_loader /"),
            ),
            (
                "LitData StreamingDataLoader, best of 0-2 workers, samples/s",
                lit["tuned"],
                _vs(best / lit["tuned"], 1.0, "staged_loader /"),
            ),
        ]
    table = ["| measurement | value | against target |", "|---|---|---|"]
    table += [f"| {name} | {value:,.1f} | {note} |" for name, value, note in rows]
    spread_rows = ["| reader (fresh process each, batch 64, shuffled) | samples/s over fresh processes |", "|---|---|"]
    spread_rows += [f"| {mode} | {spread_line(runs)} |" for mode, runs in spread.items()]
    section = "\n".join(
        [
            BEGIN,
            "## staged loader",
            "",
            f"Machine: {machine_line(cores)}; load average {load_before:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end (other work shared the cores). `python tests/bench/bench_staged_loader.py`, one run. "
            f"{args.images} ImageNet-size JPEGs (500x375 q90, scikit-image's photos) staged at 256 px; every reader returns "
            f"uint8 256x256x3 batches of {BATCH}, shuffled; best warm epoch. LitData: {lit_note}.",
            "",
            *table,
            "",
            f"Spread over {args.fresh} fresh processes per reader, interleaved:",
            "",
            *spread_rows,
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


def _vs(ratio: float, target: float, what: str) -> str:
    return f"{what} = {ratio:.1f}x (target >= {target:g}x: {'met' if ratio >= target else 'MISSED'})"


if __name__ == "__main__":
    main()
