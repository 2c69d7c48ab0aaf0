"""Robust reconstruction by coverage: coordinate-wise median and trimmed mean.

Like ``methods/width/coverage.coverage_average`` each client trained a block of every global tensor (its
index map); per element the result is taken over the clients whose block covers it (a
device covers an element when its window includes it), unweighted: a robust statistic
must not let one client claim a large sample count. An element nobody covers keeps its
global value.

* ``median``: the median of the covering values (the mean of the middle two when even).
* ``trimmed-mean``: with k covering values, drop the floor(f·k) smallest and largest and
  average the rest (f < 0.5, so at least one value stays).

Vectorised per tensor: the covering values are stacked into a (clients, *shape) float64
array with NaN where a client does not cover the element; memory is clients × tensor size.
"""

from __future__ import annotations

import numpy as np

from ..methods.width.coverage import Contribution, Weights

RULES = ("median", "trimmed-mean")


def _stacked(shape: tuple[int, ...], covering: list[tuple[np.ndarray, tuple[np.ndarray, ...]]]) -> np.ndarray:
    """(clients, *shape) float64: each client's values in its block, NaN elsewhere."""
    stack = np.full((len(covering), *shape), np.nan)
    for row, (values, indices) in zip(stack, covering, strict=True):
        block = np.ix_(*indices)
        if values.shape != row[block].shape:
            raise ValueError(f"client tensor {values.shape} does not fit its block {row[block].shape}")
        row[block] = values
    return stack


def per_element(stack: np.ndarray, rule: str, trim_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(``rule`` over axis 0 ignoring NaN, the count of non-NaN values) per element; elements
    with no value get 0."""
    counts = np.sum(~np.isnan(stack), axis=0)
    ordered = np.sort(stack, axis=0)  # NaN sorts last
    rank = np.arange(stack.shape[0]).reshape((-1,) + (1,) * (stack.ndim - 1))
    if rule == "median":
        low, high = (counts - 1) // 2, counts // 2
        keep = (rank == low) | (rank == high)
    elif rule == "trimmed-mean":
        cut = np.floor(trim_fraction * counts).astype(np.int64)
        keep = (rank >= cut) & (rank < counts - cut)
    else:
        raise ValueError(f"unknown robust rule {rule!r}; one of {RULES}")
    kept = np.sum(keep, axis=0)
    total = np.sum(np.where(keep, ordered, 0.0), axis=0)
    return np.where(kept > 0, total / np.maximum(kept, 1), 0.0), counts


def coverage_robust(global_weights: Weights, contributions: list[Contribution], rule: str,
                    trim_fraction: float = 0.1) -> Weights:
    """The new global weights: per element, ``rule`` over the covering clients' values
    (clients with no samples count as nobody); uncovered elements unchanged."""
    if rule == "trimmed-mean" and not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim fraction must be in [0, 0.5), got {trim_fraction}")
    out: Weights = {}
    for name, current in global_weights.items():
        covering = [(np.asarray(weights[name], np.float64), index_map[name])
                    for weights, index_map, n in contributions if name in index_map and n > 0]
        if not covering:
            out[name] = current
            continue
        value, counts = per_element(_stacked(current.shape, covering), rule, trim_fraction)
        merged = np.where(counts > 0, value, current)
        out[name] = (np.rint(merged) if current.dtype.kind in "iu" else merged).astype(current.dtype)
    return out
