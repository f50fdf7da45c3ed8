"""Set-up steps of the GPU acceptance run (``tests/gpu/acceptance.sh``): the CUDA torch and a small photo set.

    python tests/gpu/prepare.py venv DIR              a virtualenv that sees this interpreter's packages (its torch)
    python tests/gpu/prepare.py torch [--index URL]   keep this interpreter's CUDA torch, or install one
    python tests/gpu/prepare.py photos DIR [--count N] an ImageFolder tree of JPEGs for stage-data
    python tests/gpu/prepare.py requirements           the tool's dependencies, one a line (for a wheelhouse)

Runs before the tool's dependencies are installed, so it needs only the standard library (Pillow for photos).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import random
import re
import site
import subprocess
import sys
import venv
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from checks.tables.torchbuilds import best_variant  # noqa: E402 - pure stdlib, after the path is set

# The index pytorch.org/get-started/locally names; each CUDA variant is a folder below it (".../cu128").
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# scikit-image's bundled public-domain / CC0 photos (as tests/datasets/photos.py), read from the wheel.
SKIMAGE_PHOTOS = ("rocket.jpg", "retina.jpg", "hubble_deep_field.jpg", "astronaut.png", "coffee.png", "chelsea.png")


def make_venv(path: Path) -> str:
    """``python -m venv --system-site-packages --clear``; when this Python is itself a virtualenv (where an image
    keeps its torch), its site-packages are added by a .pth file, since the system ones would be the base's."""
    pip = "its own pip"
    try:
        venv.EnvBuilder(system_site_packages=True, clear=True, with_pip=True).create(path)
    except subprocess.CalledProcessError:  # Debian/Ubuntu without python3-venv: no ensurepip
        venv.EnvBuilder(system_site_packages=True, clear=True, with_pip=False).create(path)
        pip = "the box's pip (no ensurepip here)"
    if sys.prefix == sys.base_prefix:
        return f"{path}: a virtualenv over {sys.executable} and its site-packages, {pip}"
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    purelib = path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (purelib / "acceptance-box-env.pth").write_text("\n".join(outer) + "\n", encoding="utf-8")
    return f"{path}: a virtualenv over the virtualenv {sys.prefix} (its site-packages by acceptance-box-env.pth), {pip}"


def torch_build(python: str = sys.executable) -> tuple[str | None, str | None, str]:
    """(torch version, CUDA version, error) of ``python``'s torch, probed in a child (a broken install can hang)."""
    code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, None, "importing torch took over 120 s"
    if done.returncode != 0:
        return None, None, (done.stderr.strip().splitlines() or ["no output"])[-1]
    version, cuda = json.loads(done.stdout.strip().splitlines()[-1])
    return version, cuda, ""


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output, or '' when it is missing or fails."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def driver_facts() -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """The compute capabilities of the GPUs and the CUDA version the driver supports, from nvidia-smi."""
    caps = []
    for line in nvidia_smi("--query-gpu=compute_cap", "--format=csv,noheader").splitlines():
        m = re.match(r"\s*(\d+)\.(\d+)", line)
        if m:
            caps.append((int(m.group(1)), int(m.group(2))))
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi())
    return caps, (int(m.group(1)), int(m.group(2))) if m else None


def ensure_torch(index: str) -> int:
    """Keep a CUDA torch this interpreter already sees; otherwise install the variant the driver can run."""
    version, cuda, error = torch_build()
    if version and cuda:
        print(f"keeping the box's torch {version} (CUDA {cuda}) from {sys.executable}")
        return 0
    why = error or f"torch {version} is a CPU build"
    caps, driver_cuda = driver_facts()
    variant = best_variant(caps, driver_cuda) if caps else None
    if variant is None:
        print(f"no CUDA torch ({why}) and no wheel variant fits GPUs {caps} / driver CUDA {driver_cuda}")
        return 1
    url = f"{index.rstrip('/')}/{variant.name}"
    print(f"no CUDA torch ({why}): installing torch from {url}", flush=True)
    # --ignore-installed: a CPU torch in the system site-packages would otherwise count as satisfied.
    pip = [sys.executable, "-m", "pip", "install", "--progress-bar", "off", "--ignore-installed", "torch"]
    code = subprocess.run([*pip, "--index-url", url], check=False).returncode
    version, cuda, error = torch_build()
    print(f"installed CUDA torch {version} (CUDA {cuda})" if cuda else f"install failed: {error or 'no CUDA'}")
    return code or (0 if cuda else 1)


def _skimage_photos() -> list[bytes]:
    try:
        dist = importlib.metadata.distribution("scikit-image")
    except importlib.metadata.PackageNotFoundError:
        return []
    files = [Path(str(dist.locate_file(f"skimage/data/{name}"))) for name in SKIMAGE_PHOTOS]
    return [f.read_bytes() for f in files if f.is_file()]


def _synthetic(index: int, rng: random.Random) -> Image:
    """A 160x120 picture: a gradient in the class's hue, noise and a box, so JPEG has real work to do."""
    from PIL import Image, ImageDraw

    im = Image.linear_gradient("L").resize((160, 120)).convert("RGB")
    tint = Image.new("RGB", im.size, ((index * 67) % 256, (index * 131) % 256, (index * 199) % 256))
    im = Image.blend(im, tint, 0.5)
    im = Image.blend(im, Image.effect_noise(im.size, 40).convert("RGB"), 0.3)
    x, y = rng.randrange(100), rng.randrange(60)
    ImageDraw.Draw(im).rectangle((x, y, x + 50, y + 50), outline=(255, 255, 255), width=3)
    return im


def make_photos(dest: Path, count: int, classes: int = 4, seed: int = 0) -> str:
    """Write ``count`` JPEGs in ``classes`` class folders; scikit-image's photos when installed, else synthetic."""
    from PIL import Image

    rng = random.Random(seed)
    sources = [Image.open(io.BytesIO(b)).convert("RGB") for b in _skimage_photos()]
    for i in range(count):
        label = i % classes
        if sources:
            base = sources[i % len(sources)]
            side = rng.randint(min(base.size) // 3, min(base.size))
            x, y = rng.randint(0, base.width - side), rng.randint(0, base.height - side)
            im = base.crop((x, y, x + side, y + side)).resize((rng.randint(96, 320),) * 2)
        else:
            im = _synthetic(label, rng)
        folder = dest / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        im.save(folder / f"{i:05d}.jpg", "JPEG", quality=rng.randint(70, 95))
    return "scikit-image photos" if sources else "synthetic pictures (scikit-image is not installed)"


def requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The [project] dependencies, read without tomllib (Python 3.10 has none)."""
    text = pyproject.read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    return re.findall(r'^\s*"([^"]+)"', block.group(1), re.M) if block else []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("venv", help="make the run's virtualenv over this interpreter's packages")
    make.add_argument("path", type=Path)
    torch = sub.add_parser("torch", help="keep this interpreter's CUDA torch or install one")
    torch.add_argument("--index", default=PYTORCH_INDEX, help="PyTorch wheel index (the variant is appended)")
    photos = sub.add_parser("photos", help="write a small ImageFolder tree of JPEGs")
    photos.add_argument("dest", type=Path)
    photos.add_argument("--count", type=int, default=512)
    sub.add_parser("requirements", help="print the tool's dependencies, one a line")
    args = parser.parse_args(argv)
    if args.command == "venv":
        print(make_venv(args.path))
        return 0
    if args.command == "torch":
        return ensure_torch(args.index)
    if args.command == "photos":
        kind = make_photos(args.dest, args.count)
        print(f"wrote {args.count} JPEGs under {args.dest}: {kind}")
        return 0
    print("\n".join(requirements()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
