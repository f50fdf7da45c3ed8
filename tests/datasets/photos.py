"""Real photos for the tests, loaded from the installed scikit-image wheel (never copied into the repository).

scikit-image ships public-domain / CC0 photos (docs/sources.md#offline-test-images): rocket.jpg, retina.jpg,
hubble_deep_field.jpg and PNG photos (astronaut, coffee, chelsea, motorcycle). The files are read through
importlib.metadata, without importing skimage. Tests re-encode them at several sizes, qualities, progressive or
baseline, in every colour mode, and plant broken files next to them.
"""

from __future__ import annotations

import importlib.metadata
import io
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

PHOTOS = (
    "rocket.jpg",
    "retina.jpg",
    "hubble_deep_field.jpg",
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "motorcycle_left.png",
)


@cache
def photo_bytes(name: str) -> bytes:
    """Return the bytes of one bundled photo; skip the test when scikit-image is not installed."""
    try:
        dist = importlib.metadata.distribution("scikit-image")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("scikit-image (real test photos) is not installed: pip install '.[test]'")
    return Path(str(dist.locate_file(f"skimage/data/{name}"))).read_bytes()


@cache
def photo(name: str) -> Image.Image:
    """Return a bundled photo as an RGB image (shared: do not modify it)."""
    return Image.open(io.BytesIO(photo_bytes(name))).convert("RGB")


@cache
def scaled(name: str, scale: float) -> Image.Image:
    base = photo(name)
    size = (max(32, int(base.width * scale)), max(32, int(base.height * scale)))
    return base.resize(size, Image.Resampling.BICUBIC)


def encode(im: Image.Image, fmt: str = "JPEG", **kwargs: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def variants(count: int) -> list[tuple[str, bytes]]:
    """Return ``count`` (name, JPEG bytes) re-encodings of the photos: sizes, qualities, progressive, crops."""
    out = []
    sizes = (0.5, 1.0, 1.6)
    for i in range(count):
        name = PHOTOS[i % len(PHOTOS)]
        im = scaled(name, sizes[(i // len(PHOTOS)) % len(sizes)])
        if i % 3 == 1:  # portrait crops too
            im = im.crop((0, 0, max(32, im.width // 2), im.height))
        quality = (60, 75, 90, 97)[i % 4]
        data = encode(im, quality=quality, progressive=bool(i % 2), subsampling=(2 if quality < 95 else 0))
        out.append((f"{Path(name).stem}_{i:04d}.jpg", data))
    return out


def image_tree(root: Path, per_class: int, classes: tuple[str, ...] = ("cat", "dog", "fish")) -> Path:
    """Write an ImageFolder tree of re-encoded photos; return its root."""
    photos = variants(per_class * len(classes))
    for k, cls in enumerate(classes):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for name, data in photos[k * per_class : (k + 1) * per_class]:
            (root / cls / name).write_bytes(data)
    return root


def plant_bad_files(folder: Path) -> dict[str, str]:
    """Write broken inputs into ``folder``; return name -> the start of the reason they must be rejected with."""
    folder.mkdir(parents=True, exist_ok=True)
    good = encode(photo("rocket.jpg"), quality=90)
    bad = {
        "truncated.jpg": (good[: len(good) // 2], "corrupt or truncated"),
        "zero.jpg": (b"", "empty file"),
        "text.jpg": (b"this is not an image\n", "not an image"),
        "half.png": (photo_bytes("coffee.png")[:100_000], "corrupt or truncated"),
        "noise.jpg": (b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8, "corrupt or truncated|not an image"),
    }
    for name, (data, _) in bad.items():
        (folder / name).write_bytes(data)
    return {name: reason for name, (_, reason) in bad.items()}


def reference(data: bytes, size: int, policy: str = "crop") -> np.ndarray:
    """Decode independently: full-size decode (no DCT draft), then resize the centred square (or everything)."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    side = min(w, h)
    box = (0, 0, w, h) if policy == "stretch" else ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
    return np.asarray(im.resize((size, size), Image.Resampling.BICUBIC, box=box))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)
