"""Loading datasets by name for the server and the simulator (nothing is downloaded here).

Every dataset comes back as a :class:`Dataset`: images x float32 (N, C, H, W) in [0, 1] and
labels y int64 (N,). Names:

* ``"digits"``: scikit-learn's 8x8 digits (bundled), (N, 1, 8, 8), stratified seeded
  train/test split.
* ``"mnist"``, ``"fashion_mnist"``: (N, 1, 28, 28), the official 60k/10k split, read from
  an npz or the four IDX files found by ``locate`` (``data_dir``, or Debian's package
  directory for Fashion-MNIST).
* ``"npz:<path>"``: any npz with arrays ``x`` and ``y``, split like digits.

A device's own local data is an npz read by ``sdk_device.data.npz.load_npz``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .catalogue import CATALOGUE, SPLIT_KEYS, KnownDataset, known_dataset
from .errors import DatasetError
from .idx import read_idx
from .locate import locate
from .npz import read_npz
from .split import stratified_split, stratified_subset

KNOWN_DATASETS = (*CATALOGUE, "npz:<path>")


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays: x float32 (N, C, H, W) in [0, 1], y int64 (N,) in [0, num_classes)."""

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

    def subset(self, train: int | None = None, test: int | None = None, seed: int = 0) -> Dataset:
        """A label-stratified, seeded subset: about ``train`` training and ``test`` test
        samples (None: all of that split). Keeps ``num_classes``."""
        tr = stratified_subset(self.y_train, train, seed) if train else np.arange(len(self.y_train))
        te = stratified_subset(self.y_test, test, seed + 1) if test else np.arange(len(self.y_test))
        return Dataset(self.name, self.x_train[tr], self.y_train[tr], self.x_test[te], self.y_test[te],
                       self.num_classes)


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Load a dataset by name ("digits", "mnist", "fashion_mnist", "npz:<path>").

    ``seed`` and ``test_fraction`` drive the stratified split of "digits" and "npz:";
    "mnist" and "fashion_mnist" keep their official split and are looked for in ``data_dir``
    (see ``locate``). DatasetError (one line) when a file is missing, unreadable or wrong.
    """
    if name.startswith("npz:"):
        return _load_npz_dataset(Path(name[len("npz:"):]), seed, test_fraction)
    from ..byo.load import is_user_ref

    if is_user_ref(name):  # pkg.module:load or file.py[:load]: a user's loader (user_loader.py)
        return _load_user_dataset(name)
    try:
        dataset = known_dataset(name)
    except DatasetError:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(KNOWN_DATASETS)}") from None
    if dataset.bundled:
        return _load_digits(seed, test_fraction)
    return _load_known(dataset, data_dir)


# --------------------------------------------------------------------------- digits / npz


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float64) / 16.0).astype(np.float32)
    x = x.reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    return _split_dataset("digits", x, y, seed, test_fraction)


def _load_npz_dataset(path: Path, seed: int, test_fraction: float) -> Dataset:
    arrays = read_npz(path, ("x", "y"))
    x = _to_nchw(arrays["x"], path)
    y = _check_labels(arrays["y"], len(x), path, "y")
    return _split_dataset(f"npz:{path}", x, y, seed, test_fraction)


def _load_user_dataset(ref: str) -> Dataset:
    from .user_loader import call_user_loader

    x_train, y_train, x_test, y_test = call_user_loader(ref)
    source = Path(ref)
    x_train, x_test = _to_nchw(x_train, source), _to_nchw(x_test, source)
    y_train = _check_labels(y_train, len(x_train), source, "y_train")
    y_test = _check_labels(y_test, len(x_test), source, "y_test")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetError(f"--dataset {ref}: train samples are {x_train.shape[1:]}, "
                           f"test samples {x_test.shape[1:]}")
    classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    return Dataset(ref, x_train, y_train, x_test, y_test, classes)


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
    raise DatasetError(f"{source}: x must have shape (N,D), (N,H,W) or (N,C,H,W), got {x.shape}")


def _check_labels(y: np.ndarray, n: int, source: Path, key: str) -> np.ndarray:
    """Return y as int64 (N,) after checking it is 1-D, integer, non-negative and length n."""
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(f"{source}: {key} must be a 1-D integer array, "
                           f"got shape {y.shape} dtype {y.dtype}")
    if len(y) != n:
        raise DatasetError(f"{source}: {key} has {len(y)} labels for {n} images")
    if n and y.min() < 0:
        raise DatasetError(f"{source}: {key}: labels must be >= 0, found {int(y.min())}")
    return y.astype(np.int64)


def _split_dataset(name: str, x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float) -> Dataset:
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


# --------------------------------------------------------------------------- MNIST-style


def _load_known(dataset: KnownDataset, data_dir: str | Path | None) -> Dataset:
    """An MNIST-style dataset from its npz or IDX files, shapes and labels checked."""
    location = locate(dataset, data_dir)
    if location.format == "npz":
        arrays = read_npz(location.path, SPLIT_KEYS)
        sources = dict.fromkeys(SPLIT_KEYS, location.path)
    else:
        sources = location.files
        arrays = {key: read_idx(path) for key, path in sources.items()}
    parts = {}
    for part in ("train", "test"):
        xk, yk = f"x_{part}", f"y_{part}"
        x = _images(arrays[xk], dataset, sources[xk], xk)
        y = _check_labels(arrays[yk], len(x), sources[yk], yk)
        if len(y) and y.max() >= dataset.num_classes:
            raise DatasetError(f"{sources[yk]}: {yk}: labels must be < {dataset.num_classes}, "
                               f"found {int(y.max())}")
        parts[part] = (x, y)
    (x_train, y_train), (x_test, y_test) = parts["train"], parts["test"]
    return Dataset(dataset.name, x_train, y_train, x_test, y_test, dataset.num_classes)


def _images(x: np.ndarray, dataset: KnownDataset, source: Path, key: str) -> np.ndarray:
    """(N, H, W) pixels (integers 0..255, or floats in [0, 1]) -> float32 (N, 1, H, W) in [0, 1]."""
    if x.ndim != 3 or x.shape[1:] != dataset.image_shape:
        h, w = dataset.image_shape
        raise DatasetError(f"{source}: {key} must be (N, {h}, {w}) images, got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        if x.dtype != np.uint8 and len(x) and (x.min() < 0 or x.max() > 255):
            raise DatasetError(f"{source}: {key}: pixels must be 0..255, found {x.min()}..{x.max()}")
        out = x.astype(np.float32)
        out /= 255.0
    elif np.issubdtype(x.dtype, np.floating):
        out = x.astype(np.float32)
        if len(out) and (out.min() < 0.0 or out.max() > 1.0):
            raise DatasetError(f"{source}: {key}: float pixels must be in [0, 1], "
                               f"found {out.min()}..{out.max()}")
    else:
        raise DatasetError(f"{source}: {key} must hold numbers, got dtype {x.dtype}")
    return out[:, None, :, :]
