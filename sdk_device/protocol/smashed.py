"""Smashed data: the inputs of a model's last linear layer for some local samples.

FedConv's projection stage (``server_toolkit/methods/fedconv/projection.py``) trains only the last
linear layers, so the inputs of those layers are constants of the frozen bodies. A task
asks for them with its optional ``smashed`` field (at most that many samples); a device
that can compute them answers with a second blob next to its weights: a safetensors file
holding exactly ``x`` (n, F) float32 (the layer inputs) and ``y`` (n,) int64 (the labels),
1 ≤ n ≤ the requested count. The receiver checks it like any update (``check_smashed``).
Sharing them tells the aggregator more about the local data than weights do: a device may
decline (``fedsdk run --no-smashed``) and simply send no second blob.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blobs import encode_tensors
from .errors import ProtocolError

X, Y = "x", "y"


@dataclass(frozen=True)
class SmashedRequest:
    """What a server asks for and accepts: at most ``samples`` rows of ``features`` (F)
    inputs of the last linear layer, with labels in 0 … ``classes`` − 1."""

    samples: int
    features: int
    classes: int

    def __post_init__(self) -> None:
        if min(self.samples, self.features, self.classes) <= 0:
            raise ValueError(f"smashed request needs positive sizes, got {self}")

    def max_bytes(self) -> int:
        """Largest acceptable blob: 4 bytes per feature and 8 per label, plus 64 KiB of header."""
        return self.samples * (4 * self.features + 8) + 65536


def encode_smashed(features: np.ndarray, labels: np.ndarray) -> bytes:
    """The blob a device sends: ``features`` (n, F) as float32, ``labels`` (n,) as int64."""
    x = np.ascontiguousarray(features, np.float32)
    y = np.ascontiguousarray(labels, np.int64)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"smashed data must be (n, F) and (n,), got {x.shape} and {y.shape}")
    return encode_tensors({X: x, Y: y})


def check_smashed(tensors: dict[str, np.ndarray], request: SmashedRequest) -> tuple[np.ndarray, np.ndarray]:
    """Validate a decoded smashed blob; returns (x (n, F) float32, y (n,) int64).

    Raises ProtocolError: ``missing_tensor``, ``unexpected_tensor``, ``shape_mismatch``
    (dtypes, shapes, n outside 1 … samples), ``non_finite``, ``invalid_field`` (a label
    outside 0 … classes − 1).
    """
    missing = sorted({X, Y} - set(tensors))
    extra = sorted(set(tensors) - {X, Y})
    if missing:
        raise ProtocolError("missing_tensor", f"smashed data lacks {missing}")
    if extra:
        raise ProtocolError("unexpected_tensor", f"smashed data has unknown tensors {extra[:5]}")
    x, y = tensors[X], tensors[Y]
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != request.features:
        got, want = f"{x.dtype}{list(x.shape)}", f"float32[n, {request.features}]"
        raise ProtocolError("shape_mismatch", f"smashed x: got {got}, expected {want}")
    if y.dtype != np.int64 or y.shape != (len(x),):
        got, want = f"{y.dtype}{list(y.shape)}", f"int64[{len(x)}]"
        raise ProtocolError("shape_mismatch", f"smashed y: got {got}, expected {want}")
    if not 1 <= len(x) <= request.samples:
        raise ProtocolError("shape_mismatch", f"smashed data has {len(x)} rows; 1..{request.samples} asked")
    if not np.isfinite(x).all():
        raise ProtocolError("non_finite", "smashed x contains NaN or Inf")
    if y.min() < 0 or y.max() >= request.classes:
        raise ProtocolError("invalid_field", f"smashed y has labels outside 0..{request.classes - 1}")
    return x, y
