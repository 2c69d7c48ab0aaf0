"""A device's local dataset: an ``.npz`` file with arrays ``x`` (samples) and ``y`` (labels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class DataError(ValueError):
    """Local data that cannot be used for training."""


def load_npz(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Load ``x`` as float32 (N, ...) and ``y`` as int64 (N,); DataError explains problems."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no data file at {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f or "y" not in f:
                raise DataError(f"{path} must hold arrays 'x' and 'y'; it has {sorted(f.files)}")
            x, y = f["x"], f["y"]
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"cannot read {path} as npz: {exc}") from None
    if y.ndim != 1 or len(x) != len(y) or len(y) == 0:
        raise DataError(f"{path}: need x of shape (N, ...) and y of shape (N,), got {x.shape}, {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: y must be integer labels and x numeric (got {y.dtype}, {x.dtype})")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def save_npz(path: str | Path, x: np.ndarray, y: np.ndarray) -> None:
    """Write a device dataset file (the format ``load_npz`` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=np.asarray(x, np.float32), y=np.asarray(y, np.int64))
