"""``--dataset pkg.module:load`` or ``--dataset file.py[:load]``: a user's data loader.

The contract: ``load()`` takes no argument and returns ``(x_train, y_train, x_test, y_test)``,
numpy arrays (or anything ``numpy.asarray`` takes): x numeric with shape (N, C, H, W),
(N, H, W) or (N, D) (uint8 is scaled by 1/255, other types become float32 as they are); y
integer labels 0..K-1. The number of classes is the largest label + 1 over both splits
(``datasets.load_dataset`` checks and shapes the arrays)."""

from __future__ import annotations

import numpy as np

from ..byo.load import UserCodeError, load_user_function
from .errors import DatasetError


def call_user_loader(ref: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four arrays ``ref``'s loader returns; DatasetError (one line) when it breaks the contract."""
    try:
        arrays = load_user_function(ref, "load", "--dataset")()
    except UserCodeError as exc:
        raise DatasetError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the user's loader failing is one line too
        raise DatasetError(f"--dataset {ref}: the loader failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(arrays, (tuple, list)) or len(arrays) != 4:
        raise DatasetError(f"--dataset {ref}: the loader must return (x_train, y_train, x_test, y_test)")
    return tuple(np.asarray(a) for a in arrays)
