"""The private aggregate of DP-FedAvg over sub-model windows.

Central mode, per round: each device's update delta Δᵢ = wᵢ − w_sent (float tensors of its
window) is clipped to L2 norm ≤ C over the whole window (``sdk_device.privacy.clip_delta``).
Per element e of the global model, with kₑ the number of devices whose window covers e:

    w_new[e] = w[e] + (Σ_{i covers e} Δᵢ[e] + N(0, σ²)) / kₑ,    σ = z·C

Why every element gets the stated guarantee: the released vector is the noised *sum*
S + N(0, σ²I) over all elements, and adding or removing one device changes S by its own
clipped delta, whose L2 norm over its window (and so over the whole model, being zero
outside it) is at most C, whatever the window. That is the Gaussian mechanism with
sensitivity C and multiplier z. Dividing by kₑ afterwards is post-processing, so the noise
std on the average is z·C / kₑ: it is scaled per element by that element's coverage,
larger where few devices cover it (the outer channels only wide tiers train). The
coverage kₑ follows from the devices' tiers, which the server assigns and treats as
public, as the usual DP-FedAvg treats the number of participants.

The average is unweighted (each device counts once): sample-weighting would let a device
with many samples exceed the sensitivity. Integer tensors keep their global value (they
are not noised, so they must not be released from the devices' data). The noise is drawn
from the operating system's entropy, never from the run's seed: anyone knowing that seed
could subtract the noise.

Local mode: the devices clipped and noised their own deltas (recipe ``dp_clip``,
``dp_noise``); the server averages the deltas per element over the covering devices, so an
element covered by k devices carries noise std z·C / √k.
"""

from __future__ import annotations

import numpy as np

from sdk_device.privacy import clip_delta, float_names

from ..methods.base import Weights
from ..methods.width.coverage import IndexMap, coverage_counts


def clipped_deltas(pairs: list[tuple[Weights, Weights]],
                   clip: float | None) -> tuple[list[Weights], list[float]]:
    """(Δᵢ clipped to ``clip`` (None: as they are), ‖Δᵢ‖ before clipping) per (sent, returned)."""
    deltas, norms = [], []
    for sent, returned in pairs:
        clipped, norm = clip_delta(sent, returned, clip if clip is not None else np.inf)
        deltas.append({k: np.asarray(clipped[k], np.float64) - np.asarray(sent[k], np.float64)
                       for k in float_names(sent, returned)})
        norms.append(norm)
    return deltas, norms


def noised_window_mean(global_weights: Weights, deltas: list[tuple[Weights, IndexMap]], noise_std: float,
                       rng: np.random.Generator) -> Weights:
    """``global + (Σ covering deltas + N(0, noise_std²)) / coverage`` per element of every
    float tensor; uncovered elements and integer tensors unchanged."""
    out: Weights = {}
    for name, current in global_weights.items():
        covering = [(d[name], window[name]) for d, window in deltas if name in d and name in window]
        if current.dtype.kind != "f" or not covering:
            out[name] = current
            continue
        counts = coverage_counts(current.shape, [(indices, 1.0) for _, indices in covering])
        total = np.zeros(current.shape, np.float64)
        for delta, indices in covering:
            total[np.ix_(*indices)] += delta
        if noise_std > 0:
            total += rng.normal(0.0, noise_std, size=current.shape)
        step = np.where(counts > 0, total / np.maximum(counts, 1.0), 0.0)
        out[name] = (current.astype(np.float64) + step).astype(current.dtype)
    return out
