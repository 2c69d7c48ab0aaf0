"""Adaptive quantile clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially
private learning with adaptive clipping").

Each round the server learns, privately, which fraction b of the devices' update norms was
at most the clipping norm C, and moves C geometrically towards the target quantile γ:
C ← C · exp(−η (b̃ − γ)), with b̃ = (Σᵢ 1[‖Δᵢ‖ ≤ C] + N(0, σ_b²)) / m, m the round's devices
and η = 0.2 (the paper's value). The count is released too, so the privacy of a round is
split: with the overall noise multiplier z, the updates get z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)
and the two releases together compose to exactly one Gaussian mechanism of multiplier z
(the paper's Theorem 1), which the accountant charges. σ_b = max(m / 20, z): the paper's
m/20, raised to z when needed, so z_Δ ≤ 1.155·z always exists.
"""

from __future__ import annotations

import math

import numpy as np

LEARNING_RATE = 0.2


def count_noise(devices: int, noise_multiplier: float) -> float:
    """σ_b, the std of the noise on the count of unclipped updates."""
    return max(devices / 20.0, noise_multiplier)


def update_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """z_Δ: the multiplier left for the updates once the count took its share."""
    return (noise_multiplier ** -2 - (2 * count_std) ** -2) ** -0.5


def next_clip(clip: float, norms: list[float], quantile: float, count_std: float,
              rng: np.random.Generator, learning_rate: float = LEARNING_RATE) -> float:
    """The next round's clipping norm after a round whose updates had these L2 ``norms``."""
    unclipped = sum(1 for n in norms if n <= clip) + rng.normal(0.0, count_std)
    fraction = unclipped / max(len(norms), 1)
    return clip * math.exp(-learning_rate * (fraction - quantile))
