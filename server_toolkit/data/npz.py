"""Reading arrays (never pickles) and array shapes out of ``.npz`` files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .errors import DatasetError, one_line


def read_npz(path: str | Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Load the named arrays from an npz without unpickling; DatasetError on any problem."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"npz file not found: {path}")
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path} is not an npz file (not a zip archive); write one with "
                           "numpy.savez(path, x=..., y=...)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise DatasetError(
                    f"{path}: missing array(s) {', '.join(missing)}; found {', '.join(npz.files) or 'none'}"
                )
            return {k: npz[k] for k in keys}
    except DatasetError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read as npz without pickles: {one_line(exc)}") from exc


def npz_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{array name: shape} of an npz, reading only each array's header (nothing is inflated
    beyond it, so this is fast on large compressed files)."""
    path = Path(path)
    shapes = {}
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path} is not an npz file (not a zip archive); write one with "
                           "numpy.savez(path, x=..., y=...)")
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, _ = np.lib.format.read_array_header_1_0(f)
                    else:
                        shape, _, _ = np.lib.format.read_array_header_2_0(f)
                shapes[member[: -len(".npy")]] = tuple(int(d) for d in shape)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read as npz: {one_line(exc)}") from exc
    return shapes
