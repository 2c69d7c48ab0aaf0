"""Reconstruction by coverage: put sub-model results back into the global tensors.

Each client trained a block of every global tensor (its index map: the global indices of
axis 0 and, for weights, axis 1; kernel axes whole). Per element, the new value is the
sample-weighted mean over the clients whose block covers it; an element covered by nobody
keeps its global value (clients with no samples count as nobody). Work is per client and
per tensor, with numpy fancy indexing (``np.ix_``) over whole blocks: no loop over
elements. A block's indices must be distinct (the width planner's windows are sets), so
``block += values`` adds each element once.

The arithmetic is FedAvg's (float64, each client's values times n_i / total before
summing, in the clients' order): when every client covers everything the result equals
``weighted_average`` bit for bit.
"""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]
IndexMap = dict[str, tuple[np.ndarray, ...]]  # tensor name -> global indices per leading axis
Contribution = tuple[Weights, IndexMap, float]  # (sub-model weights, where they sit, samples)


def coverage_counts(shape: tuple[int, ...], blocks: list[tuple[tuple[np.ndarray, ...], float]]) -> np.ndarray:
    """Per element of a tensor of ``shape``: the sum of ``amount`` over the ``(indices,
    amount)`` blocks covering it (amount 1 counts clients, n_i counts samples); float64."""
    counts = np.zeros(shape, np.float64)
    for indices, amount in blocks:
        counts[np.ix_(*indices)] += amount
    return counts


def coverage_average(global_weights: Weights, contributions: list[Contribution]) -> Weights:
    """The new global weights: per element, the sample-weighted mean of the covering clients'
    values; uncovered elements (and tensors nobody trained) unchanged. ValueError when a
    client's tensor does not have its block's shape."""
    out: Weights = {}
    for name, current in global_weights.items():
        covering = [(weights[name], index_map[name], n) for weights, index_map, n in contributions
                    if name in index_map and n > 0]
        if not covering:
            out[name] = current
            continue
        counts = coverage_counts(current.shape, [(indices, n) for _, indices, n in covering])
        total = np.zeros(current.shape, np.float64)
        for values, indices, n in covering:
            block = np.ix_(*indices)
            if values.shape != total[block].shape:
                raise ValueError(f"{name}: client tensor {values.shape} does not fit its block "
                                 f"{total[block].shape}")
            total[block] += values.astype(np.float64) * (n / counts[block])
        merged = np.where(counts > 0, total, current)
        out[name] = (np.rint(merged) if current.dtype.kind in "iu" else merged).astype(current.dtype)
    return out


def narrowest_average(global_weights: Weights, contributions: list[tuple[float, Contribution]]) -> Weights:
    """``coverage_average`` where each element takes only the covering contributions of the
    smallest trained ratio among them: ``contributions`` are (ratio, contribution) pairs,
    averaged one ratio at a time from the narrowest, each group writing the elements no
    narrower group covered (HeteroFL's ``narrowest_owns``)."""
    out = dict(global_weights)
    owned = {name: np.zeros(value.shape, bool) for name, value in global_weights.items()}
    for ratio in sorted({r for r, _ in contributions}):
        group = [c for r, c in contributions if r == ratio and c[2] > 0]
        merged = coverage_average(global_weights, group)
        for name in global_weights:
            blocks = [(index_map[name], 1.0) for _, index_map, _ in group if name in index_map]
            covered = coverage_counts(global_weights[name].shape, blocks) > 0
            fresh = covered & ~owned[name]
            out[name] = np.where(fresh, merged[name], out[name]).astype(global_weights[name].dtype)
            owned[name] |= covered
    return out


def nested_average(global_weights: Weights, narrow: list[Contribution], wide: list[Contribution],
                   inner: str = "narrow") -> Weights:
    """HeteroFL's ``also_narrowest`` aggregate. ``narrow``: every returned model of the
    narrowest window (a wide device's second model and the narrowest devices' own);
    ``wide``: the wider windows. ``inner="narrow"``: the elements a narrow model covers are
    the sample-weighted mean of the narrow models alone (AllSmall's FedAvg when they all share
    one window), every other element the coverage mean of the wide windows (a wide window's
    values inside the narrow window are discarded); ``inner="average"``: one coverage mean of
    all of them (a wide window's inner values averaged in beside the narrow models')."""
    if inner == "average":
        return coverage_average(global_weights, [*narrow, *wide])
    if inner != "narrow":
        raise ValueError(f"inner must be 'narrow' or 'average', got {inner!r}")
    small = coverage_average(global_weights, narrow)
    large = coverage_average(global_weights, wide)
    out: Weights = {}
    for name, current in global_weights.items():
        blocks = [(index_map[name], 1.0) for _, index_map, n in narrow if name in index_map and n > 0]
        owned = coverage_counts(current.shape, blocks) > 0
        out[name] = np.where(owned, small[name], large[name]).astype(current.dtype)
    return out
