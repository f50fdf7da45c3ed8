"""Decode one image file to an S x S x 3 uint8 array: the fast path, every mode to RGB, EXIF orientation.

The recipe (docs/sources.md#jpeg-draft-decode): let libjpeg-turbo downscale in the DCT domain by 1/2, 1/4 or 1/8
(Pillow's ``draft`` picks the largest power of two that keeps the image at least S x S; other factors are
slower than a full decode), then one antialiased resize of only the region that survives the crop (datasets/resize.py:
a SIMD convolution where installed, else Pillow's).
"""

from __future__ import annotations

import io
import os
import stat
import struct
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from datasets import resize

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"})
RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "hamming": Image.Resampling.HAMMING,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
RESIZE_POLICIES = ("crop", "stretch")
# Transparent pixels are composited onto white, as image viewers and browsers show them; dropping the alpha
# channel instead exposes whatever colour the transparent pixels happen to hold (often black).
BACKGROUND = (255, 255, 255)
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


class RejectedImage(Exception):
    """An input that cannot become a training sample; the message is the reason recorded in the manifest."""


@dataclass(frozen=True)
class Resize:
    """How a decoded image becomes S x S."""

    size: int
    policy: str = "crop"
    resample: str = "bicubic"
    resizer: str = resize.PILLOW  # resize.backend_id's choice, made once by the staging process


def decode_file(path: str, spec: Resize) -> np.ndarray:
    """Decode the image at ``path``; raise RejectedImage with the reason when it is not a usable image."""
    try:
        data = read_regular(path)
    except OSError as exc:
        raise RejectedImage(f"unreadable: {exc.strerror or exc}") from None
    if not data:
        raise RejectedImage("empty file (0 bytes)")
    return decode_bytes(data, spec)


def read_regular(path: str) -> bytes:
    """Read a regular file whole; refuse a FIFO, socket or device that took an input's place after the scan.

    O_NONBLOCK: opening a FIFO otherwise waits for a writer, forever (it has no effect on a regular file).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RejectedImage("not a regular file (a FIFO, socket or device)")
        return fh.read()


def short_sides(paths: list[str]) -> list[int]:
    """Return the shorter side in pixels of each readable image among ``paths``, from its header only."""
    sides = []
    for path in paths:
        try:
            side = _short_side(path)
        except (OSError, ValueError, SyntaxError, struct.error, Image.DecompressionBombError):
            continue  # not a usable image: decoding rejects it with its reason
        if side is not None:
            sides.append(side)
    return sides


def _short_side(path: str) -> int | None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(fh) as im:
                return min(im.size)


def decode_bytes(data: bytes, spec: Resize) -> np.ndarray:
    """Decode encoded image bytes to a (S, S, 3) uint8 array."""
    # Pillow would otherwise pad a truncated JPEG with grey and return it as if it were whole (docs/sources.md#jpeg-draft-decode).
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                return _to_array(im, spec)
    except UnidentifiedImageError:
        raise RejectedImage("not an image (no known image format)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise RejectedImage(f"too large: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as exc:  # what Pillow's plugins raise
        raise RejectedImage(f"corrupt or truncated: {_first_line(exc)}") from None


def _to_array(im: Image.Image, spec: Resize) -> np.ndarray:
    if im.format == "JPEG":
        im.draft("RGB", (spec.size, spec.size))
    im.seek(0)  # multi-frame GIF/TIFF: the first frame
    im.load()
    im = ImageOps.exif_transpose(im)
    rgb = to_rgb(im)
    box = crop_box(rgb.size, spec.policy)
    out = resize.resize(rgb, spec.size, spec.resample, box, spec.resizer)
    return np.asarray(out, dtype=np.uint8)


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB: alpha over white, 16-bit scaled (not clipped), CMYK, palette."""
    if im.mode == "RGB":
        return im
    if im.mode in _SIXTEEN_BIT:
        grey = np.asarray(im, dtype=np.uint32) >> 8  # 0..65535 -> 0..255; convert("L") would clip at 255
        return Image.fromarray(np.clip(grey, 0, 255).astype(np.uint8), "L").convert("RGB")
    if im.mode == "F":
        raise RejectedImage("floating-point image (mode F): no defined 8-bit mapping")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif im.mode == "1":
        im = im.convert("L")
    if im.mode in _ALPHA_MODES:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return im.convert("RGB")


def crop_box(size: tuple[int, int], policy: str) -> tuple[float, float, float, float]:
    """Return the source region to resize: the centred square (crop) or the whole image (stretch)."""
    w, h = size
    if policy == "stretch":
        return (0.0, 0.0, float(w), float(h))
    side = min(w, h)
    left, top = (w - side) / 2, (h - side) / 2
    return (left, top, left + side, top + side)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
