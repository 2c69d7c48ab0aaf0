"""Offline image datasets for simulations (numpy + scikit-learn only, never downloads).

Every dataset comes back as a :class:`Dataset` with images shaped (N, C, H, W) float32
and labels shaped (N,) int64.  Known names:

* ``"digits"``: scikit-learn's 8x8 handwritten digits (ships with the library),
  pixel values scaled to [0, 1], stratified seeded train/test split.
* ``"mnist"``: MNIST read from a local ``data_dir`` holding either ``mnist.npz``
  (Keras layout) or the four IDX files (optionally gzipped).
* ``"npz:<path>"``: any npz file with arrays ``x`` and ``y``, split like digits.

A device's own local data is an npz read by ``sdk_device.data.npz.load_npz``.
"""

from __future__ import annotations

import gzip
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KNOWN_DATASETS = ("digits", "mnist", "npz:<path>")

MNIST_NPZ = "mnist.npz"
MNIST_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

# IDX type code (third magic byte) -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class DatasetError(ValueError):
    """A dataset could not be found, read, or validated."""


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays: x float32 (N, C, H, W), y int64 (N,), labels in [0, num_classes)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one sample, (C, H, W)."""
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Load a dataset by name ("digits", "mnist", "npz:<path>"); nothing is downloaded.

    ``seed`` and ``test_fraction`` drive the stratified split of "digits" and "npz:";
    "mnist" keeps its official 60k/10k split and needs ``data_dir``.
    """
    if name.startswith("npz:"):
        return _load_npz_dataset(Path(name[len("npz:"):]), seed, test_fraction)
    key = name.strip().lower()
    if key == "digits":
        return _load_digits(seed, test_fraction)
    if key == "mnist":
        return _load_mnist(data_dir)
    raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(KNOWN_DATASETS)}")


# --------------------------------------------------------------------------- digits / npz


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float64) / 16.0).astype(np.float32)
    x = x.reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    return _split_dataset("digits", x, y, seed, test_fraction)


def _load_npz_dataset(path: Path, seed: int, test_fraction: float) -> Dataset:
    arrays = _read_npz(path, ("x", "y"))
    x = _to_nchw(arrays["x"], path)
    y = _check_labels(arrays["y"], len(x), path)
    return _split_dataset(f"npz:{path}", x, y, seed, test_fraction)


def _to_nchw(x: np.ndarray, source: Path) -> np.ndarray:
    """Return float32 (N, C, H, W): (N,H,W) -> (N,1,H,W), (N,D) -> (N,1,1,D); uint8 / 255."""
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif np.issubdtype(x.dtype, np.number) and not np.issubdtype(x.dtype, np.complexfloating):
        x = x.astype(np.float32)
    else:
        raise DatasetError(f"{source}: x must be numeric, got dtype {x.dtype}")
    if x.ndim == 2:
        return x.reshape(x.shape[0], 1, 1, x.shape[1])
    if x.ndim == 3:
        return x.reshape(x.shape[0], 1, x.shape[1], x.shape[2])
    if x.ndim == 4:
        return x
    raise DatasetError(
        f"{source}: x must have shape (N,D), (N,H,W) or (N,C,H,W), got {x.shape}"
    )


def _check_labels(y: np.ndarray, n: int, source: Path) -> np.ndarray:
    """Return y as int64 (N,) after checking it is 1-D, integer, non-negative and length n."""
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(
            f"{source}: y must be a 1-D integer array, got shape {y.shape} dtype {y.dtype}"
        )
    if len(y) != n:
        raise DatasetError(f"{source}: x has {n} samples but y has {len(y)}")
    if n and y.min() < 0:
        raise DatasetError(f"{source}: labels must be >= 0, found {int(y.min())}")
    return y.astype(np.int64)


def stratified_split(
    y: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per class, put round(count * test_fraction) shuffled samples in test; returns indices."""
    train_parts, test_parts = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(len(idx) * test_fraction))
        test_parts.append(idx[:n_test])
        train_parts.append(idx[n_test:])
    train = rng.permutation(np.concatenate(train_parts)).astype(np.int64)
    test = rng.permutation(np.concatenate(test_parts)).astype(np.int64)
    return train, test


def _split_dataset(
    name: str, x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float
) -> Dataset:
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if len(y) == 0:
        raise DatasetError(f"{name}: dataset is empty")
    train, test = stratified_split(y, test_fraction, np.random.default_rng(seed))
    return Dataset(
        name=name,
        x_train=x[train],
        y_train=y[train],
        x_test=x[test],
        y_test=y[test],
        num_classes=int(y.max()) + 1,
    )


# --------------------------------------------------------------------------- MNIST


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (plain or .gz) into a native-endian array of its stored shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read IDX file: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    dtype = _IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise DatasetError(f"{path}: truncated IDX header ({ndim} dimensions declared)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_end != expected:
        raise DatasetError(
            f"{path}: IDX dims {dims} need {expected} data bytes, file has {len(raw) - header_end}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_end).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def _find_idx(data_dir: Path, base: str) -> Path | None:
    for candidate in (data_dir / base, data_dir / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _mnist_not_found(where: str, missing: list[str] | None = None) -> DatasetError:
    idx_names = ", ".join(f"{base}[.gz]" for base in MNIST_IDX_FILES.values())
    text = (
        f"MNIST not found {where}: looked for {MNIST_NPZ} (keys x_train, y_train, x_test, "
        f"y_test) or the four IDX files {idx_names}"
    )
    if missing:
        text += f"; missing: {', '.join(missing)}"
    return DatasetError(text + ". Datasets are never downloaded; copy the files there.")


def _load_mnist(data_dir: str | Path | None) -> Dataset:
    if data_dir is None:
        raise _mnist_not_found("(no data_dir given)")
    data_dir = Path(data_dir)
    npz_path = data_dir / MNIST_NPZ
    if npz_path.is_file():
        arrays = _read_npz(npz_path, tuple(MNIST_IDX_FILES))
        source = npz_path
    else:
        found = {key: _find_idx(data_dir, base) for key, base in MNIST_IDX_FILES.items()}
        missing = [f"{MNIST_IDX_FILES[k]}[.gz]" for k, p in found.items() if p is None]
        if missing:
            raise _mnist_not_found(f"in {data_dir}", missing)
        arrays = {key: read_idx(p) for key, p in found.items() if p is not None}
        source = data_dir

    splits = {}
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim != 3:
            raise DatasetError(f"{source}: x_{part} must be (N, H, W), got shape {x.shape}")
        if np.issubdtype(x.dtype, np.integer):  # raw 0..255 pixels
            x = x.astype(np.float32) / 255.0
        else:
            x = x.astype(np.float32)
        splits[part] = (x[:, None, :, :], _check_labels(y, len(x), source))
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    top = max(int(y_train.max(initial=0)), int(y_test.max(initial=0)))
    return Dataset(
        name="mnist",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=max(10, top + 1),
    )


# --------------------------------------------------------------------------- npz helpers


def _read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Load the named arrays from an npz (no pickles); DatasetError on any problem."""
    if not path.is_file():
        raise DatasetError(f"npz file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise DatasetError(
                    f"{path}: missing array(s) {', '.join(missing)}; found {', '.join(npz.files)}"
                )
            return {k: npz[k] for k in keys}
    except DatasetError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read as npz without pickles: {exc}") from exc
