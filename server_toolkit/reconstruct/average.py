"""Reconstruction by averaging: the sample-weighted mean of same-shaped weights."""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def weighted_average(updates: list[tuple[Weights, float]]) -> Weights:
    """``sum_i w_i * n_i / sum_i n_i`` per tensor; every update must have the same names
    and shapes. Integer tensors are averaged in float64 and rounded back."""
    if not updates:
        raise ValueError("nothing to average")
    total = float(sum(n for _, n in updates))
    if total <= 0:
        raise ValueError("sample counts must add up to more than zero")
    names = updates[0][0].keys()
    out: Weights = {}
    for name in names:
        acc = np.zeros(updates[0][0][name].shape, np.float64)
        for weights, n in updates:
            acc += weights[name].astype(np.float64) * (n / total)
        dtype = updates[0][0][name].dtype
        out[name] = (np.rint(acc) if dtype.kind in "iu" else acc).astype(dtype)
    return out
