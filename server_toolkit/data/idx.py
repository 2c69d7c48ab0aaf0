"""The IDX format of MNIST-style files: reading (plain or gzipped) and writing headers.

An IDX file is ``00 00 TT NN`` (TT: element type, NN: number of dimensions), then NN
big-endian uint32 dimensions, then the elements, big-endian, in C order. MNIST's images are
type 0x08 (uint8) with 3 dimensions (magic 0x00000803), its labels 0x08 with 1 (0x00000801).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from .errors import DatasetError, one_line

GZIP_MAGIC = b"\x1f\x8b"

# IDX type code (third magic byte) -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# Errors the gzip module raises on a damaged stream.
GZIP_ERRORS = (OSError, EOFError, zlib.error)


def is_gzip(path: str | Path) -> bool:
    """Whether the file starts with the gzip magic (the name's suffix is not trusted)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def read_content(path: str | Path) -> bytes:
    """The file's bytes, gunzipped when it is a gzip file; DatasetError when unreadable."""
    path = Path(path)
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except GZIP_ERRORS as exc:
        raise DatasetError(f"{path}: cannot read: {one_line(exc)}") from exc


def decode_idx(raw: bytes, source: str | Path) -> np.ndarray:
    """IDX bytes -> a native-endian array of the stored shape and type (a copy)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DatasetError(f"{source}: not an IDX file (bad magic number {raw[:4].hex()})")
    dtype = IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise DatasetError(f"{source}: truncated IDX header ({ndim} dimensions declared)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_end != expected:
        raise DatasetError(
            f"{source}: IDX dims {dims} need {expected} data bytes, file has {len(raw) - header_end}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_end).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (plain or gzipped) into a native-endian array of its stored shape."""
    return decode_idx(read_content(path), path)


def read_idx_dims(path: str | Path) -> tuple[int, ...]:
    """The dimensions in an IDX file's header, reading (and gunzipping) only the header."""
    path = Path(path)
    try:
        opener = gzip.open if is_gzip(path) else open
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[:2] != b"\0\0" or head[2] not in IDX_DTYPES:
                raise DatasetError(f"{path}: not an IDX file (bad magic number {head.hex()})")
            dims = f.read(4 * head[3])
    except GZIP_ERRORS as exc:
        raise DatasetError(f"{path}: cannot read: {one_line(exc)}") from exc
    if len(dims) < 4 * head[3]:
        raise DatasetError(f"{path}: truncated IDX header ({head[3]} dimensions declared)")
    return struct.unpack(f">{head[3]}I", dims)


def idx_header(array: np.ndarray) -> bytes:
    """The IDX header of a uint8 array (magic 0x000008NN, then its big-endian dimensions)."""
    if array.dtype != np.uint8:
        raise ValueError(f"only uint8 arrays have an IDX header here, got {array.dtype}")
    return struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
