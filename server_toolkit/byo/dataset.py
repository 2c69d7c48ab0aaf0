"""``--dataset pkg.module:load`` or ``--dataset file.py[:load]``: a user's data loader.

The contract: ``load()`` takes no argument and returns ``(x_train, y_train, x_test, y_test)``,
numpy arrays (or anything ``numpy.asarray`` takes): x numeric with shape (N, C, H, W),
(N, H, W) or (N, D) (uint8 is scaled by 1/255, other types become float32 as they are); y
integer labels 0..K-1. The number of classes is the largest label + 1 over both splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.datasets import Dataset, _check_labels, _to_nchw
from ..data.errors import DatasetError
from .load import UserCodeError, load_user_function


def load_user_dataset(ref: str) -> Dataset:
    """The dataset ``ref``'s loader returns; DatasetError (one line) when it breaks the contract."""
    try:
        loader = load_user_function(ref, "load", "--dataset")
        arrays = loader()
    except UserCodeError as exc:
        raise DatasetError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the user's loader failing is one line too
        raise DatasetError(f"--dataset {ref}: the loader failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(arrays, (tuple, list)) or len(arrays) != 4:
        raise DatasetError(f"--dataset {ref}: the loader must return (x_train, y_train, x_test, y_test)")
    source = Path(ref)
    x_train, x_test = (_to_nchw(np.asarray(x), source) for x in (arrays[0], arrays[2]))
    y_train = _check_labels(np.asarray(arrays[1]), len(x_train), source, "y_train")
    y_test = _check_labels(np.asarray(arrays[3]), len(x_test), source, "y_test")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetError(f"--dataset {ref}: train samples are {x_train.shape[1:]}, test samples "
                           f"{x_test.shape[1:]}")
    classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    return Dataset(ref, x_train, y_train, x_test, y_test, classes)
