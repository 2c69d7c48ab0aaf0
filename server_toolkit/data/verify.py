"""Checking a dataset's files against the catalogue's digests.

* A gzipped IDX file passes when its MD5 is the canonical ``.gz`` MD5 (a byte-exact copy)
  or, failing that, when the SHA-256 of its decompressed bytes is the content SHA-256 (a
  re-compressed copy, e.g. Debian's). A plain IDX file passes on the content SHA-256.
* An npz passes array by array: each of x_train, y_train, x_test, y_test (integers in
  0..255, any integer dtype) is written as the IDX file it came from would be (magic
  0x00000803 for images, 0x00000801 for labels, big-endian uint32 dimensions, the values as
  uint8 in C order) and the SHA-256 of those bytes must be that file's content SHA-256.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .catalogue import SPLIT_KEYS, IdxFile, KnownDataset
from .errors import DatasetError, one_line
from .idx import GZIP_ERRORS, idx_header, is_gzip
from .locate import Location
from .npz import read_npz

CHUNK = 1 << 20
BY_MD5 = "md5 of the canonical .gz"
BY_CONTENT = "content sha256"


@dataclass(frozen=True)
class FileCheck:
    """The verdict on one file (or one array of an npz): ``label`` names it, ``how`` says
    which digest matched (``BY_MD5``/``BY_CONTENT`` ...) or why nothing did."""

    path: Path
    label: str
    ok: bool
    how: str


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _content_sha256(path: Path, gz: bool, limit: int) -> str:
    """SHA-256 of the (decompressed) bytes; DatasetError past ``limit`` bytes (a wrong or
    hostile file is not inflated without bound)."""
    digest, size = hashlib.sha256(), 0
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
        while chunk := f.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise DatasetError(f"holds more than the expected {limit} bytes")
            digest.update(chunk)
    return digest.hexdigest()


def check_idx_file(path: str | Path, spec: IdxFile) -> FileCheck:
    """Verify one IDX file (gzipped or plain) against ``spec``'s digests."""
    path = Path(path)
    try:
        gz = is_gzip(path)
        md5 = _md5(path) if gz else None
        if md5 == spec.gz_md5:
            return FileCheck(path, path.name, True, BY_MD5)
        sha = _content_sha256(path, gz, spec.content_size)
    except DatasetError as exc:
        return FileCheck(path, path.name, False, f"decompressed, it {exc}")
    except GZIP_ERRORS as exc:
        return FileCheck(path, path.name, False, f"unreadable: {one_line(exc)}")
    if sha == spec.content_sha256:
        note = " (re-compressed copy: its .gz md5 differs from the canonical one)" if gz else " (plain IDX)"
        return FileCheck(path, path.name, True, BY_CONTENT + note)
    if gz:
        why = f"neither the .gz md5 ({md5}, want {spec.gz_md5}) nor the content sha256 matches"
    else:
        why = "content sha256 does not match"
    return FileCheck(path, path.name, False, f"{why} (content sha256 {sha}, want {spec.content_sha256})")


def array_sha256(array: np.ndarray) -> str:
    """SHA-256 of the IDX encoding of an integer array with values 0..255 (see the module
    docstring); ValueError for other arrays."""
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"dtype {array.dtype} is not an integer type")
    if array.dtype != np.uint8:
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ValueError(f"values {array.min()}..{array.max()} do not fit 0..255")
        array = array.astype(np.uint8)
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(idx_header(array))
    digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def check_npz_file(path: str | Path, dataset: KnownDataset) -> list[FileCheck]:
    """Verify each array of an npz copy of ``dataset`` (one check per array)."""
    path = Path(path)
    try:
        arrays = read_npz(path, SPLIT_KEYS)
    except DatasetError as exc:
        return [FileCheck(path, path.name, False, str(exc).removeprefix(f"{path}: "))]
    checks = []
    for key in SPLIT_KEYS:
        spec, label = dataset.file(key), f"{path.name}[{key}]"
        try:
            sha = array_sha256(arrays[key])
        except ValueError as exc:
            checks.append(FileCheck(path, label, False, f"not IDX-encodable: {exc}"))
            continue
        ok = sha == spec.content_sha256
        how = (f"array {BY_CONTENT} (as {spec.name})" if ok
               else f"array content sha256 {sha} differs from {spec.name}'s {spec.content_sha256}")
        checks.append(FileCheck(path, label, ok, how))
    return checks


def verify_location(location: Location) -> list[FileCheck]:
    """Verify every file of a located dataset."""
    if location.format == "npz":
        return check_npz_file(location.path, location.dataset)
    return [check_idx_file(path, location.dataset.file(key)) for key, path in location.files.items()]
