"""The one resize of stage-data's recipe: a SIMD convolution (fast_image_resize) where installed, else Pillow's.

Decoding an ImageNet-size JPEG (500x375) takes ~0.65 ms of libjpeg-turbo on this box, and Pillow's antialiased
bicubic resize of its centred square to 256 px ~1.8 ms more: the resize, not the decode, is most of the work, and
no DCT-domain shortcut applies (halving 375 px would go under 256). ``cykooz-resizer`` binds the Rust crate
fast_image_resize (docs/sources.md#fast-image-resize), whose convolution is Pillow's (the same kernels, widened by
the scale factor, over the same crop box) in SSE4.1/AVX2/NEON: the same resize in ~0.45 ms, within rounding of
Pillow's pixels (BENCHMARKS.md, "stage-data against LitData"). It is a declared dependency; where it cannot be
imported, and for the filters it has no Pillow-matching kernel for (nearest, box, hamming), Pillow resizes.

Which of the two resized a staged dataset is part of its parameters (``backend_id``): its pixels differ from the
other's by rounding, so a run never resumes or skips over rows the other made.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from PIL import Image

PILLOW = "pillow"
SIMD_PACKAGE = "cykooz-resizer"
# Pillow's filter name -> fast_image_resize's kernel of the same formula (Pillow's bicubic is Catmull-Rom, a=-0.5).
# Not box: on a non-integer scale fast_image_resize weighs the edge pixels differently (up to 55 levels off).
SIMD_FILTERS = {"bilinear": "bilinear", "bicubic": "catmull_rom", "lanczos": "lanczos3"}

try:
    import cykooz_resizer as _simd
except ImportError:  # not installed, or a wheel for another platform: Pillow resizes
    _simd = None

_resizer: Any = None  # one per process (a fork server's workers each build their own on first use)


def simd_available() -> bool:
    """Tell whether the SIMD resizer can be used in this environment."""
    return _simd is not None


def backend_id(resample: str) -> str:
    """Name the resizer that ``resample`` runs on here, with its version: the staged dataset's ``resizer``."""
    if _simd is None or resample not in SIMD_FILTERS:
        return PILLOW
    return f"{SIMD_PACKAGE} {importlib.metadata.version(SIMD_PACKAGE)}"


def resize(
    rgb: Image.Image, size: int, resample: str, box: tuple[float, float, float, float], backend: str
) -> Image.Image:
    """Resize the ``box`` region of an RGB image to ``size`` x ``size`` with the ``backend`` that ``backend_id`` named."""
    if backend == PILLOW:
        return rgb.resize((size, size), Image.Resampling[resample.upper()], box=box)
    if _simd is None:
        raise RuntimeError(f"{SIMD_PACKAGE} is not importable in this process (the run chose {backend})")
    global _resizer
    if _resizer is None:
        _resizer = _simd.Resizer()
    left, top, right, bottom = box
    options = _simd.ResizeOptions(
        _simd.ResizeAlg.convolution(_simd.FilterType[SIMD_FILTERS[resample]]),
        crop_box=_simd.CropBox(left, top, right - left, bottom - top),
    )
    out = Image.new("RGB", (size, size))
    _resizer.resize_pil(rgb, out, options)
    return out
