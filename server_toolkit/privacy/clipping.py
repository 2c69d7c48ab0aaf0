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

Under secure aggregation (``secure``) no delta is in the clear: each device clipped its own
delta to C and masked it with weight 1 (recipe ``dp_secure_clip``), so the server holds S and
A per element already - a secure round's unmasked sum, or the sum of edges' partials, each the
sum of its group's clipped deltas (``partial_sums``) - and ``noised_sum_mean`` finishes them
exactly as it finishes the server's own clipped deltas.

Local mode: the devices clipped and noised their own deltas (recipe ``dp_clip``,
``dp_noise``); the server averages the deltas per element over the covering devices, so an
element covered by k devices carries noise std z·C / √k.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from sdk_device.privacy import clip_delta, float_names

from ..methods.base import ClientUpdate, Weights
from ..methods.records import COVERAGE
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


def partial_sums(updates: list[ClientUpdate], deltas: bool) -> tuple[Weights, Weights]:
    """(S, A) per global tensor from edges' partials of clipped deltas weighted 1 (``model`` =
    base + S_e / A_e where A_e > 0, ``coverage`` = A_e): S_e = A_e (model - base), base = the
    weights the edge was sent (``deltas``: zeros, the update is a staleness-scaled delta already).
    An edge with m partials in one call (async) counts 1/m of each, so a device behind it moves S
    by at most C. ValueError for an update that is not a partial."""
    share = Counter(u.device_id for u in updates)
    sums: Weights = {}
    cover: Weights = {}
    for u in updates:
        if COVERAGE not in u.others:
            raise ValueError(f"{u.device_id}: an update in the clear under secure aggregation")
        for name, a in u.others[COVERAGE].items():
            a = np.asarray(a, np.float64)
            base = 0.0 if deltas else np.asarray(u.instruction.weights[name], np.float64)
            part = np.where(a > 0, a * (np.asarray(u.weights[name], np.float64) - base), 0.0)
            sums[name] = sums.get(name, 0.0) + part / share[u.device_id]
            cover[name] = cover.get(name, 0.0) + a
    return ({k: v for k, v in sums.items() if (cover[k] > 0).any()},
            {k: v for k, v in cover.items() if (v > 0).any()})


def noised_window_mean(global_weights: Weights, deltas: list[tuple[Weights, IndexMap]], noise_std: float,
                       rng: np.random.Generator) -> Weights:
    """``global + (Σ covering deltas + N(0, noise_std²)) / coverage`` per element of every
    float tensor; uncovered elements and integer tensors unchanged."""
    sums, cover = {}, {}
    for name, current in global_weights.items():
        covering = [(d[name], window[name]) for d, window in deltas if name in d and name in window]
        if current.dtype.kind != "f" or not covering:
            continue
        cover[name] = coverage_counts(current.shape, [(indices, 1.0) for _, indices in covering])
        sums[name] = np.zeros(current.shape, np.float64)
        for delta, indices in covering:
            sums[name][np.ix_(*indices)] += delta
    return noised_sum_mean(global_weights, sums, cover, noise_std, rng)


def noised_sum_mean(global_weights: Weights, sums: Weights, cover: Weights, noise_std: float,
                    rng: np.random.Generator) -> Weights:
    """``global + (S + N(0, noise_std²)) / A`` per element of every float tensor in ``sums``
    (S: the sum of the clipped deltas covering an element, A: how many; global shapes), 0 where
    A = 0; the other tensors unchanged. The noise is drawn per tensor in ``global_weights``'
    order, so the same ``rng`` state gives the same draw whatever made the sums (secure
    aggregation's unmasked sum, edges' partial sums, the server's own clipping)."""
    out: Weights = {}
    for name, current in global_weights.items():
        if current.dtype.kind != "f" or name not in sums:
            out[name] = current
            continue
        total = np.array(sums[name], np.float64)
        if noise_std > 0:
            total += rng.normal(0.0, noise_std, size=current.shape)
        counts = np.asarray(cover[name], np.float64)
        step = np.where(counts > 0, total / np.maximum(counts, 1.0), 0.0)
        out[name] = (current.astype(np.float64) + step).astype(current.dtype)
    return out
