"""``.npy`` files written in place: a fixed-size header, space reserved up front, rows written at offsets.

The header is always HEADER_BYTES long (padded with spaces, as the format allows), so a file whose final
length is known only at the end (tokens) gets its shape rewritten in place without moving the data.
numpy reads these files like any other: ``np.load(path, mmap_mode="r")``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np

HEADER_BYTES = 128  # a multiple of 64, as numpy's writer aligns; holds any 4-D shape of 20-digit sizes
_MAGIC = b"\x93NUMPY\x01\x00"


def header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """Return the HEADER_BYTES-long ``.npy`` v1.0 header for a C-order array."""
    shape_text = repr(tuple(int(n) for n in shape))
    text = f"{{'descr': '{np.dtype(dtype).str}', 'fortran_order': False, 'shape': {shape_text}, }}"
    pad = HEADER_BYTES - len(_MAGIC) - 2 - len(text) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit a {HEADER_BYTES}-byte header")
    body = (text + " " * pad + "\n").encode("latin1")
    return _MAGIC + len(body).to_bytes(2, "little") + body


def create(path: Path, dtype: np.dtype, shape: tuple[int, ...], *, reserve: bool = True) -> None:
    """Create ``path`` with its header and room for the whole array (disk blocks reserved when ``reserve``)."""
    size = HEADER_BYTES + int(np.prod(shape)) * np.dtype(dtype).itemsize
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, header(dtype, shape), 0)
        if reserve:
            reserve_space(fd, size)
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def reserve_space(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of disk for ``fd`` now, so a full disk fails here and not mid-run."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def rewrite_shape(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Replace the header's shape in place and cut the file to the array's length."""
    size = HEADER_BYTES + int(np.prod(shape)) * np.dtype(dtype).itemsize
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, header(dtype, shape), 0)
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def allocated_bytes(path: Path) -> int:
    """Bytes of disk a file already holds (0 when missing): what a resumed run need not find free again."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def write_rows(fd: int, first_row: int, rows: np.ndarray) -> None:
    """Write ``rows`` at row index ``first_row`` of an array of rows like them."""
    rows = np.ascontiguousarray(rows)
    data = rows.reshape(-1).view(np.uint8).data
    offset = HEADER_BYTES + first_row * (rows[0].nbytes if len(rows) else 0)
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def read_rows(fd: int, first_row: int, count: int, row_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Read ``count`` rows starting at ``first_row``."""
    out = np.empty((count, *row_shape), dtype=dtype)
    view = out.reshape(-1).view(np.uint8).data
    offset = HEADER_BYTES + first_row * int(np.prod(row_shape)) * np.dtype(dtype).itemsize
    got = 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise OSError(errno.EIO, f"unexpected end of file reading {count} rows from row {first_row}")
        got += n
    return out
