"""Averaging over the clients that hold a tensor (depth-split sub-models).

Each contribution is a partial set of *global* tensors (what one client trained, possibly
plus tensors generated for it) with a weight (its sample count). A global tensor becomes
the weighted mean of the contributions that contain it; a tensor nobody sent keeps its
previous value.
"""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def average_present(global_weights: Weights, contributions: list[tuple[Weights, float]]) -> Weights:
    """Per global tensor, ``sum_i n_i w_i / sum_i n_i`` over the contributions holding it.
    Shapes must match the global tensor; integer tensors are rounded back."""
    sums = {name: np.zeros(w.shape, np.float64) for name, w in global_weights.items()}
    totals = dict.fromkeys(global_weights, 0.0)
    for tensors, weight in contributions:
        if weight <= 0:
            raise ValueError(f"contribution weights must be > 0, got {weight}")
        for name, value in tensors.items():
            if name not in sums:
                raise KeyError(f"{name!r} is not a global tensor")
            if value.shape != sums[name].shape:
                raise ValueError(f"{name}: shape {value.shape}, global is {sums[name].shape}")
            sums[name] += weight * value.astype(np.float64)
            totals[name] += weight
    out: Weights = {}
    for name, previous in global_weights.items():
        if totals[name] == 0:
            out[name] = previous
            continue
        mean = sums[name] / totals[name]
        out[name] = (np.rint(mean) if previous.dtype.kind in "iu" else mean).astype(previous.dtype)
    return out
