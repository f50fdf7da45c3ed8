"""Decoding real photos: every mode to RGB, EXIF orientation, DCT-domain draft vs an independent decode, rejects."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datasets.images import RejectedImage, Resize, crop_box, decode_bytes, decode_file, to_rgb
from tests.datasets.photos import encode, photo, photo_bytes, plant_bad_files, psnr, reference


@pytest.mark.parametrize("name", ["rocket.jpg", "retina.jpg", "hubble_deep_field.jpg", "coffee.png"])
@pytest.mark.parametrize("policy", ["crop", "stretch"])
def test_staged_pixels_match_an_independent_decode(name: str, policy: str) -> None:
    im = photo(name)
    big = im.resize((im.width * 2, im.height * 2), Image.Resampling.BICUBIC)  # draft then has work to do
    data = encode(big, quality=95)
    got = decode_bytes(data, Resize(128, policy))
    want = reference(data, 128, policy)
    assert got.shape == (128, 128, 3) and got.dtype == np.uint8
    assert psnr(got, want) > 30, "DCT draft + resize strays beyond resize tolerance"
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 4


def test_draft_really_decodes_at_a_reduced_scale() -> None:
    im = photo("retina.jpg")  # 1411 x 1411
    decoded = Image.open(io.BytesIO(encode(im, quality=90)))
    decoded.draft("RGB", (256, 256))
    assert decoded.size == (353, 353)  # 1/4 scale, the largest power of two keeping >= 256


@pytest.mark.parametrize(
    "mode",
    ["L", "P", "CMYK", "RGBA", "LA", "1", "I;16", "YCbCr"],
)
def test_every_mode_becomes_rgb(mode: str) -> None:
    im = photo("chelsea.png")
    if mode == "I;16":
        grey = np.asarray(im.convert("L"), dtype=np.uint16) * 257
        converted = Image.fromarray(grey)
    elif mode == "P":
        converted = im.convert("P", palette=Image.Palette.ADAPTIVE)
    else:
        converted = im.convert(mode)
    fmt = "JPEG" if mode in ("L", "CMYK", "YCbCr") else "PNG"
    out = decode_bytes(encode(converted, fmt), Resize(64))
    assert out.shape == (64, 64, 3)
    grey_ref = decode_bytes(encode(im.convert("L"), "PNG"), Resize(64)).astype(int)
    if mode in ("L", "I;16", "LA"):
        assert np.abs(out.astype(int) - grey_ref).mean() < 3, "grey levels were clipped or shifted"


def test_sixteen_bit_is_scaled_not_clipped() -> None:
    ramp = (np.arange(256, dtype=np.uint16).repeat(256).reshape(256, 256) * 257).T.copy()
    out = decode_bytes(encode(Image.fromarray(ramp), "PNG"), Resize(256, "stretch"))
    assert out[0, 0, 0] == 0 and out[0, -1, 0] == 255 and 100 < out[0, 128, 0] < 156


def test_transparent_pixels_become_white() -> None:
    rgba = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    out = decode_bytes(encode(rgba, "PNG"), Resize(16))
    assert (out == 255).all()


def test_real_rgba_png_from_the_wheel_decodes() -> None:
    out = decode_bytes(photo_bytes("logo.png"), Resize(64))
    assert out.shape == (64, 64, 3)


def test_exif_orientation_is_applied() -> None:
    im = photo("rocket.jpg").resize((300, 200))
    im.paste((255, 0, 0), (0, 0, 60, 200))  # a red band on the left edge
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    out = decode_bytes(encode(im, quality=95, exif=exif.tobytes()), Resize(100, "stretch"))
    assert out[2, 50, 0] > 200 and out[2, 50, 1] < 60, "red band should now run along the top"
    assert out[97, 50, 0] < 200 or out[97, 50, 1] > 60


def test_crop_box_is_the_centred_square() -> None:
    assert crop_box((400, 200), "crop") == (100.0, 0.0, 300.0, 200.0)
    assert crop_box((400, 200), "stretch") == (0.0, 0.0, 400.0, 200.0)


def test_planted_bad_files_are_rejected_with_reasons(tmp_path) -> None:
    for name, reason in plant_bad_files(tmp_path).items():
        with pytest.raises(RejectedImage, match=reason):
            decode_file(str(tmp_path / name), Resize(32))


def test_missing_file_is_unreadable(tmp_path) -> None:
    with pytest.raises(RejectedImage, match="unreadable"):
        decode_file(str(tmp_path / "gone.jpg"), Resize(32))


def test_float_images_are_refused() -> None:
    with pytest.raises(RejectedImage, match="mode F"):
        to_rgb(Image.new("F", (4, 4)))


def test_a_fifo_in_an_inputs_place_is_rejected_without_blocking(tmp_path: Path) -> None:
    """The scan skips special files; one that replaced an input after the scan must not hang the decode either."""
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def decode() -> None:
        try:
            decode_file(str(fifo), Resize(32))
        except RejectedImage as exc:
            caught.append(exc)

    worker = threading.Thread(target=decode, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked in open(): a writer's open releases it, so the suite goes on
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("decode_file blocked on a FIFO")
    assert [str(e) for e in caught] == ["not a regular file (a FIFO, socket or device)"]
