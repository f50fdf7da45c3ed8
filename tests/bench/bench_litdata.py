"""Benchmark: `invoke stage-data` against LitData's `optimize`, like for like.

Run from the repository root:  python tests/bench/bench_litdata.py [--sizes 1500 6000] [--rounds 3] [--workers 2]
It rewrites the "stage-data against LitData" section of BENCHMARKS.md, in two parts, one run:

- Decoders: images per second on one core (one process, the photos in memory) of stage-data's recipe (JPEG draft,
  EXIF transpose, one antialiased bicubic resize of the centred square to 256 px) and of the libjpeg-turbo,
  libvips, OpenCV and SIMD-resize bindings that could replace a step of it, with each one's pixel agreement with
  the Pillow recipe. The candidates that stage-data does not depend on are installed into a virtualenv of their
  own (over this environment's packages) the first time; a candidate that cannot be installed says so.
- Like for like: both commands as whole processes started from a shell (interpreter start-up, scan, decode, write,
  index or manifest), the same photos, the same worker count, alternated in every round (the first one changes
  every round), median and range. LitData's ``fn`` is stage-data's own recipe with Pillow's resize (what a user
  writes); a third row runs LitData with stage-data's SIMD resize in its ``fn`` too, to show what is left when both
  decode alike. LitData is installed in its own virtualenv (tests/bench/bench_staged_loader.py's helper).
Photos: scikit-image's, re-encoded as ImageNet-size JPEGs (500x375, q90) by tests/bench/bench_stage.py's helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from datasets import resize  # noqa: E402
from tests.bench.bench_stage import SIZE, imagenet_like, machine_line, write_tree  # noqa: E402
from tests.bench.bench_staged_loader import VENV, litdata_python  # noqa: E402
from tests.bench.benchmarks_md import write_section  # noqa: E402

BEGIN, END = "<!-- bench:litdata:begin -->", "<!-- bench:litdata:end -->"
CANDIDATES_VENV = Path.home() / ".cache" / "gpu-preflight-bench" / "decoders-venv"
# PyTurboJPEG 2.x needs libjpeg-turbo 3 (Debian 12 ships 2.1: apt-get install libturbojpeg0); pyvips-binary
# brings its own libvips. cykooz-resizer is stage-data's dependency, already in this environment.
CANDIDATE_PACKAGES = ("simplejpeg", "opencv-python-headless", "pyvips", "pyvips-binary", "PyTurboJPEG<2")
DECODER_PHOTOS = 300

# One process, one core: each candidate over the same photos (best of 3 passes), against Pillow's recipe.
DECODERS = r"""
import io, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from PIL import Image
from datasets import resize
from datasets.images import Resize, crop_box, decode_bytes
S, blobs = int(sys.argv[2]), [open(p, "rb").read() for p in sys.argv[3:]]
simd = Resize(S, resizer=resize.backend_id("bicubic"))

def pil_resize(a):
    im = Image.fromarray(a)
    return np.asarray(im.resize((S, S), Image.Resampling.BICUBIC, box=crop_box(im.size, "crop")))

def simd_resize(a):
    im = Image.fromarray(a)
    return np.asarray(resize.resize(im, S, "bicubic", crop_box(im.size, "crop"), simd.resizer))

def pow2(h, w):
    f = 1
    while min(h, w) // (2 * f) >= S and f < 8:
        f *= 2
    return -(-h // f), -(-w // f)

cands = {
    "Pillow: draft + bicubic resize (stage-data before)": lambda d: decode_bytes(d, Resize(S)),
    "Pillow: draft + fast_image_resize Catmull-Rom (stage-data now)": lambda d: decode_bytes(d, simd),
}
try:
    import simplejpeg
    def sj(d, minimum, out):
        return out(simplejpeg.decode_jpeg(d, "RGB", min_height=minimum(d)[0], min_width=minimum(d)[1]))
    hdr = lambda d: simplejpeg.decode_jpeg_header(d)[:2]
    cands["simplejpeg: scaled decode (smallest M/8 >= S) + Pillow bicubic"] = lambda d: sj(d, lambda d: (S, S), pil_resize)
    cands["simplejpeg: power-of-two scale (as draft) + Pillow bicubic"] = lambda d: sj(d, lambda d: pow2(*hdr(d)), pil_resize)
    cands["simplejpeg: power-of-two scale + fast_image_resize"] = lambda d: sj(d, lambda d: pow2(*hdr(d)), simd_resize)
except ImportError as e:
    print(json.dumps({"name": "simplejpeg", "missing": str(e)}))
try:
    from turbojpeg import TJPF_RGB, TurboJPEG
    tj = TurboJPEG()
    def tjd(d):
        w, h = tj.decode_header(d)[:2]
        sf = min((f for f in tj.scaling_factors if min(w, h) * f[0] / f[1] >= S), key=lambda f: f[0] / f[1])
        return pil_resize(tj.decode(d, pixel_format=TJPF_RGB, scaling_factor=sf))
    cands["PyTurboJPEG: scaled decode (smallest M/8 >= S) + Pillow bicubic"] = tjd
except Exception as e:
    print(json.dumps({"name": "PyTurboJPEG", "missing": f"{type(e).__name__}: {str(e).splitlines()[0]}"}))
try:
    import cv2
    cv2.setNumThreads(1)
    dec = lambda d, flag: cv2.cvtColor(cv2.imdecode(np.frombuffer(d, np.uint8), flag), cv2.COLOR_BGR2RGB)
    def area(d):
        a = dec(d, cv2.IMREAD_COLOR)
        h, w = a.shape[:2]; s = min(h, w); t, l = (h - s) // 2, (w - s) // 2
        return cv2.resize(a[t:t + s, l:l + s], (S, S), interpolation=cv2.INTER_AREA)
    cands["OpenCV: imdecode + Pillow bicubic"] = lambda d: pil_resize(dec(d, cv2.IMREAD_COLOR))
    cands["OpenCV: imdecode + cv2.resize INTER_AREA (SIMD)"] = area
except ImportError as e:
    print(json.dumps({"name": "OpenCV", "missing": str(e)}))
try:
    import pyvips
    pyvips.cache_set_max(0)
    def vips(d):
        im = pyvips.Image.thumbnail_buffer(d, S, height=S, crop="centre", size="both")
        return np.ndarray(buffer=im.write_to_memory(), dtype=np.uint8, shape=(im.height, im.width, im.bands))
    cands[f"pyvips {pyvips.version(0)}.{pyvips.version(1)}: thumbnail_buffer (shrink-on-load, centre crop)"] = vips
except Exception as e:
    print(json.dumps({"name": "pyvips", "missing": f"{type(e).__name__}: {e}"}))

def timed(fn):
    t = time.perf_counter()
    for d in blobs:
        fn(d)
    return time.perf_counter() - t

ref = [decode_bytes(d, Resize(S)) for d in blobs]
for name, fn in cands.items():
    fn(blobs[0])
    best = min(timed(fn) for _ in range(3))
    diffs = [np.abs(fn(d).astype(np.int16) - r.astype(np.int16)) for d, r in zip(blobs, ref)]
    flat = np.concatenate([x.ravel() for x in diffs])
    print(json.dumps({
        "name": name, "rate": len(blobs) / best, "mean": float(flat.mean()), "max": int(flat.max()),
        "p999": float(np.percentile(flat, 99.9)), "within1": float((flat <= 1).mean()),
        "identical": sum(bool((x == 0).all()) for x in diffs), "photos": len(blobs),
    }))
"""

# LitData's side: a file (optimize's workers import it to find fn); the scan, the decode and the index, timed
# from outside like stage-data. argv: checkout, source, output, workers, resizer ("pillow" or the SIMD one).
LITDATA = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import litdata as ld
from datasets.images import Resize, decode_file

SPEC = Resize(256, resizer=sys.argv[5])


def decode(item):
    path, label = item
    return {"image": decode_file(path, SPEC), "label": label}


if __name__ == "__main__":
    root = Path(sys.argv[2])
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    items = [(str(p), i) for i, c in enumerate(classes) for p in sorted((root / c).glob("*.jpg"))]
    ld.optimize(fn=decode, inputs=items, output_dir=sys.argv[3], num_workers=int(sys.argv[4]), chunk_bytes="64MB",
                mode="overwrite")
"""


def candidates_python(venv: Path) -> tuple[Path | None, str]:
    """A virtualenv over this environment's packages with the candidate bindings (installed on first use)."""
    python = venv / "bin" / "python"
    if not python.exists():
        made = subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True
        )
        if made.returncode:
            return None, f"cannot create a virtualenv: {made.stderr.strip()[-200:]}"
    for package in CANDIDATE_PACKAGES:  # one at a time: one that fails leaves the others
        subprocess.run([str(python), "-m", "pip", "install", "-q", package], capture_output=True, text=True)
    return python, "candidates in their own virtualenv over this environment"


def decoder_rows(python: Path, photos: list[Path]) -> list[dict[str, object]]:
    run = subprocess.run(
        [str(python), "-c", DECODERS, str(ROOT), str(SIZE), *map(str, photos)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "VIPS_CONCURRENCY": "1"},
    )
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def shell_seconds(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of ``command`` run by ``sh -c`` (exec'd: the shell is the process that starts it)."""
    line = "exec " + " ".join(_quote(x) for x in command)
    t = time.perf_counter()
    run = subprocess.run(["sh", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if run.returncode:
        sys.exit(f"{line} exited {run.returncode}: {run.stderr.strip()[-2000:]}")
    return wall


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def like_for_like(
    lit_python: Path, size: int, rounds: int, workers: int, tmp: Path, env: dict[str, str]
) -> dict[str, object]:
    """Alternated rounds of the three commands on ``size`` photos; wall seconds and stage-data's phases."""
    src = write_tree(tmp / f"photos-{size}", imagenet_like(size))
    script = tmp / "litdata_stage.py"
    script.write_text(LITDATA)
    invoke = str(Path(sysconfig.get_path("scripts")) / "invoke")
    simd = resize.backend_id("bicubic")
    commands = {
        "stage-data": [invoke, "stage-data", "--source", str(src), "--dest", str(tmp / "staged"),
                       "--size", str(SIZE), "--workers", str(workers)],
        "litdata": [str(lit_python), str(script), str(ROOT), str(src), str(tmp / "lit"), str(workers), "pillow"],
        "litdata-simd": [str(lit_python), str(script), str(ROOT), str(src), str(tmp / "lit"), str(workers), simd],
    }  # fmt: skip
    walls: dict[str, list[float]] = {name: [] for name in commands}
    phases: list[dict[str, float]] = []
    digests: set[str] = set()
    names = list(commands)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            walls[name].append(shell_seconds(commands[name], env, ROOT if name == "stage-data" else tmp))
            if name == "stage-data":
                doc = json.loads((tmp / "staged" / "manifest.json").read_text())
                phases.append(doc["timings"])
                digests.add(doc["outputs"]["images.npy"]["sha256"])
            shutil.rmtree(tmp / ("staged" if name == "stage-data" else "lit"))
    shutil.rmtree(src)
    return {"walls": walls, "phases": phases, "digests": sorted(digests)}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _ratio(lit: list[float], ours: list[float]) -> str:
    paired = sorted(a / b for a, b in zip(lit, ours, strict=True))
    return f"{statistics.median(lit) / statistics.median(ours):.2f}x (rounds {paired[0]:.2f}-{paired[-1]:.2f})"


def like_table(results: dict[int, dict[str, object]], workers: int) -> list[str]:
    rows = [
        "| photos | stage-data, s | LitData (Pillow recipe), s | LitData / stage-data (target >= 1.5x) "
        "| LitData with the SIMD resize too, s | that / stage-data |",
        "|---|---|---|---|---|---|",
    ]
    for size, res in results.items():
        walls = res["walls"]
        assert isinstance(walls, dict)
        ours, lit, lit_simd = walls["stage-data"], walls["litdata"], walls["litdata-simd"]
        met = statistics.median(lit) / statistics.median(ours) >= 1.5
        rows.append(
            f"| {size:,} | {_spread(ours)} | {_spread(lit)} | {_ratio(lit, ours)}: {'met' if met else 'MISSED'} "
            f"| {_spread(lit_simd)} | {_ratio(lit_simd, ours)} |"
        )
    return rows


def phase_table(results: dict[int, dict[str, object]]) -> list[str]:
    keys = ("scan_s", "place_s", "workers_s", "decode_s", "finalize_s", "total_s")
    rows = ["| photos | whole command | " + " | ".join(keys) + " | start-up and exit (whole - total_s) |"]
    rows.append("|---" * (len(keys) + 3) + "|")
    for size, res in results.items():
        phases, walls = res["phases"], res["walls"]
        assert isinstance(phases, list) and isinstance(walls, dict)
        med = {k: statistics.median(float(p.get(k, 0.0)) for p in phases) for k in keys}
        whole = statistics.median(walls["stage-data"])
        rest = statistics.median(w - float(p["total_s"]) for w, p in zip(walls["stage-data"], phases, strict=True))
        rows.append(f"| {size:,} | {whole:.2f} | " + " | ".join(f"{med[k]:.3f}" for k in keys) + f" | {rest:.2f} |")
    return rows


def decoder_table(rows: list[dict[str, object]]) -> list[str]:
    out = [
        "| recipe (ImageNet-size JPEG to 256x256 RGB) | images/s on one core | vs Pillow recipe "
        "| mean abs diff | max | 99.9th pct | pixels within 1 | identical photos |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = next((float(str(r["rate"])) for r in rows if "before" in str(r["name"])), 0.0)
    for r in rows:
        if "missing" in r:
            out.append(f"| {r['name']} | not installed: {str(r['missing'])[:80]} | | | | | | |")
            continue
        rate = float(str(r["rate"]))
        out.append(
            f"| {r['name']} | {rate:,.0f} | {rate / base:.2f}x | {float(str(r['mean'])):.3f} | {r['max']} "
            f"| {float(str(r['p999'])):.0f} | {float(str(r['within1'])):.2%} | {r['identical']}/{r['photos']} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1500, 6000], help="photos per like-for-like set")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds per set")
    parser.add_argument("--workers", type=int, default=2, help="decode processes on both sides")
    parser.add_argument("--litdata-venv", type=Path, default=VENV)
    parser.add_argument("--candidates-venv", type=Path, default=CANDIDATES_VENV)
    args = parser.parse_args()
    lit_python, lit_note = litdata_python(args.litdata_venv)
    if lit_python is None:
        sys.exit(f"LitData is not available: {lit_note}")
    simd = resize.backend_id("bicubic").replace(" ", "==")  # the same version in LitData's fn
    subprocess.run([str(lit_python), "-m", "pip", "install", "-q", simd], capture_output=True)
    cand_python, cand_note = candidates_python(args.candidates_venv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_PREFLIGHT_")}, "HOME": tmp}
        photos = write_tree(tmpd / "decoders", imagenet_like(DECODER_PHOTOS))
        decoders = decoder_rows(cand_python or Path(sys.executable), sorted(photos.rglob("*.jpg")))
        results = {n: like_for_like(lit_python, n, args.rounds, args.workers, tmpd, env) for n in args.sizes}
    load_after = os.getloadavg()[0]
    stable = all(len(r["digests"]) == 1 for r in results.values())  # type: ignore[arg-type]
    section = "\n".join(
        [
            BEGIN,
            "## stage-data against LitData (like for like)",
            "",
            f"Machine: {machine_line(args.workers)}; load average {load_before:.1f} at the start and {load_after:.1f} "
            f"at the end (other work shared the cores). `python tests/bench/bench_litdata.py`, one run; "
            f"litdata {lit_note} in its own virtualenv; {cand_note}.",
            "",
            f"Decoders: {DECODER_PHOTOS} ImageNet-size JPEGs (500x375 and 375x500, q90, scikit-image's photos) in "
            f"memory, one process, best of 3 passes; pixel differences against stage-data's Pillow recipe over all "
            "pixels of all photos (0-255 levels). Pillow's draft does not shrink these (half of 375 px is under 256), "
            "so the decode is a full libjpeg-turbo decode in every row and the antialiased resize of the 375 px "
            "square is most of the work: a faster decoder gains little, the SIMD resize gains most. The scaled decodes (M/8 >= S) and INTER_AREA resample differently and differ by several levels "
            "on average; the SIMD Catmull-Rom convolution is Pillow's bicubic within rounding. That tolerance (mean "
            "about 0.1 of 255 levels, 99.9% of pixels within 1, a few up to ~10 at sharp edges) does not matter for "
            "training: q90 JPEG coding itself moves pixels by more, and every augmentation (a random resized crop "
            "resamples every pixel, a colour jitter shifts them by tens of levels) by far more; what matters, the "
            "same bytes for the same source, holds (tests/datasets/test_resize.py). None of the other bindings "
            "applies EXIF orientation (these photos have none).",
            "",
            *decoder_table(decoders),
            "",
            f"Like for like: both as whole processes started from `sh -c` (interpreter start-up, scan, decode, "
            f"write, index or manifest), {args.workers} decode workers each, the same ImageNet-size photos, "
            f"{args.rounds} rounds in alternated order, median (min-max) of wall seconds; the ratio is of the "
            "medians (the per-round ratios in brackets). stage-data: `invoke stage-data --dest ... --size 256 "
            f"--workers {args.workers}` (writes images.npy, labels.npy, classes.json and manifest.json, fdatasynced "
            "before it journals them); LitData: `litdata.optimize(fn=decode, inputs=(path, label) pairs, "
            f"num_workers={args.workers}, chunk_bytes='64MB')` whose `fn` is stage-data's recipe with Pillow's "
            "resize (`datasets.images.decode_file`, resizer `pillow`), and again with the SIMD resize. images.npy's "
            f"sha256 was {'the same in every round' if stable else 'NOT the same in every round'}.",
            "",
            *like_table(results, args.workers),
            "",
            "stage-data's phases (manifest.json `timings`, median over the rounds, s):",
            "",
            *phase_table(results),
            END,
        ]
    )
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, section)
    print(section)


if __name__ == "__main__":
    main()
