"""Fixed-point encoding of floats into Z/2**64 (uint64, numpy's wrapping arithmetic).

``encode(v) = round(v * SCALE) mod 2**64``; a sum of encodings decodes to the sum of the
values within ``n * 0.5 / SCALE`` (each term is rounded once), as long as the true sum
stays within +-2**63 / SCALE. Devices clip every value to +-``CLIP`` and weight it by
their sample count n_i, so a round cannot wrap while ``sum_i n_i * CLIP * SCALE < 2**63``,
i.e. fewer than ``max_total_weight()`` (= 8.8e9) samples per round.
"""

from __future__ import annotations

import math

import numpy as np

SCALE = 2.0**20  # resolution 9.5e-7 per weighted value
CLIP = 1000.0  # |value| bound each device clips to (model weights are far inside it)
HALF = 2**63


def encode(values: np.ndarray) -> np.ndarray:
    """float -> uint64 fixed point (two's complement for negatives). Values must already be
    within the range (``check_range``); ValueError otherwise."""
    values = np.asarray(values, np.float64)
    scaled = np.rint(values * SCALE)
    if not np.isfinite(scaled).all() or np.abs(scaled).max(initial=0) >= HALF:
        raise ValueError("a value is outside the fixed-point range (NaN, Inf or too large)")
    return scaled.astype(np.int64).view(np.uint64)


def decode(encoded: np.ndarray) -> np.ndarray:
    """uint64 fixed point -> float64 (values >= 2**63 are negative)."""
    return np.asarray(encoded, np.uint64).view(np.int64).astype(np.float64) / SCALE


def max_total_weight(clip: float = CLIP) -> float:
    """The largest sum of weights (sample counts) a round may have without the weighted sum
    wrapping: ``2**63 / (clip * SCALE)``."""
    return HALF / (clip * SCALE)


def rounding_norm(elements: int) -> float:
    """The largest L2 norm of the rounding error of ``elements`` encoded values (each
    ``<= 0.5 / SCALE``): a vector clipped to ``C - rounding_norm(n)`` encodes to norm ``<= C``."""
    return math.sqrt(max(elements, 0)) * 0.5 / SCALE


def tolerance(total_weight: float, devices: int) -> float:
    """The largest error of a decoded weighted mean: ``devices * 0.5 / SCALE`` over the weights."""
    return devices * 0.5 / SCALE / total_weight
