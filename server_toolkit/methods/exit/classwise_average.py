"""Per-class averaging of classifier rows: a class's row is averaged over the clients that
have samples of that class.

A classifier tensor (a linear layer's weight or bias whose first axis is the classes) is
averaged row by row: ``row_c = sum_i n_ic w_i[c] / sum_i n_ic``, where ``n_ic`` is client
``i``'s number of training samples of class ``c``, over the contributions that hold the
tensor. A class none of them has samples of keeps its previous row.

Why: under label skew a client that has no sample of class ``c`` only ever pushes row ``c``
down during local training (cross-entropy's gradient on an absent class's logit is always
positive); its row ``c`` carries no information about class ``c``. A plain sample-weighted
mean lets the few clients that train a layer overwrite every class's row with such rows.
"""

from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def classwise_average(global_weights: Weights, contributions: list[tuple[Weights, np.ndarray]],
                      names: list[str]) -> Weights:
    """The tensors ``names`` averaged per class (see the module docstring). Each contribution
    is ``(tensors, counts)`` with ``counts`` (num_classes,) >= 0, the client's samples per
    class; a tensor no contribution holds is left out of the result."""
    out: Weights = {}
    for name in names:
        previous = global_weights[name]
        held = [(tensors[name], counts) for tensors, counts in contributions if name in tensors]
        if not held:
            continue
        rows = np.zeros(previous.shape, np.float64)
        totals = np.zeros(previous.shape[0], np.float64)
        for value, counts in held:
            counts = np.asarray(counts, np.float64)
            if counts.shape != (previous.shape[0],) or (counts < 0).any():
                raise ValueError(f"{name}: need {previous.shape[0]} class counts >= 0, got {counts.shape}")
            if value.shape != previous.shape:
                raise ValueError(f"{name}: shape {value.shape}, global is {previous.shape}")
            rows += counts.reshape(-1, *[1] * (previous.ndim - 1)) * value.astype(np.float64)
            totals += counts
        seen = (totals > 0).reshape(-1, *[1] * (previous.ndim - 1))
        mean = rows / np.maximum(totals, 1e-300).reshape(seen.shape)
        out[name] = np.where(seen, mean, previous).astype(previous.dtype)
    return out
