"""Differential-privacy maths a device (and the server) applies to what leaves it (numpy only).

* ``clip_delta``: the update delta ``returned - sent`` over the floating-point tensors both
  hold, scaled so its L2 norm (over all of them together) is at most ``clip``. Integer
  tensors (e.g. BatchNorm's ``num_batches_tracked``) are not part of the delta and go back
  as sent: they could carry information the clipping does not bound.
* ``noised_delta``: ``clip_delta`` plus independent Gaussian noise of standard deviation
  ``std`` on every float element (local DP: the recipe's ``dp_clip`` and ``dp_noise``).
* ``secure_delta``: the update delta over every tensor returned, its float part scaled to L2
  norm <= ``clip`` (float64; integer tensors 0): what a device masks in a secure round of a run
  with central DP (recipe ``dp_secure_clip``, weight 1; ``secagg_sessions.py``).
* ``noised_label_counts``: a label histogram over ``classes`` labels with Laplace noise of
  scale 1/epsilon per count, rounded and floored at 0 (post-processing). Adding or removing
  one sample changes one count by 1 (L1 sensitivity 1), so one report is epsilon-DP for
  every sample's label; all ``classes`` counts are sent, so the largest label held is not
  revealed either.

The noise must be unknown to the server: the device draws it from the operating system's
entropy (``np.random.default_rng()`` without a seed), never from the task's seed.
"""

from __future__ import annotations

import math

import numpy as np

Weights = dict[str, np.ndarray]


def float_names(sent: Weights, returned: Weights) -> list[str]:
    """Names of the floating-point tensors both hold with the same shape, sorted."""
    return sorted(k for k, v in returned.items()
                  if k in sent and np.asarray(v).dtype.kind == "f" and np.shape(sent[k]) == np.shape(v))


def delta_l2(sent: Weights, returned: Weights) -> float:
    """‖returned - sent‖₂ over the float tensors both hold (float64 sums)."""
    total = 0.0
    for k in float_names(sent, returned):
        d = np.asarray(returned[k], np.float64) - np.asarray(sent[k], np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
    return math.sqrt(total)


def clip_factor(norm: float, clip: float) -> float:
    """The factor min(1, clip / norm) that brings a delta of L2 ``norm`` within ``clip``."""
    return 1.0 if norm <= clip else clip / norm


def clip_delta(sent: Weights, returned: Weights, clip: float) -> tuple[Weights, float]:
    """(``sent`` + the float delta scaled to L2 <= ``clip``, the delta's norm before clipping).
    Integer tensors come back as sent; float64 arithmetic, the returned dtypes kept."""
    norm = delta_l2(sent, returned)
    scale = clip_factor(norm, clip)
    out = {k: np.asarray(v) for k, v in returned.items()}
    for k in out:
        if k in sent and out[k].dtype.kind in "iub":
            out[k] = np.asarray(sent[k]).astype(out[k].dtype)
    for k in float_names(sent, returned):
        base = np.asarray(sent[k], np.float64)
        out[k] = (base + scale * (np.asarray(returned[k], np.float64) - base)).astype(out[k].dtype)
    return out, norm


def secure_delta(sent: Weights, returned: Weights, clip: float) -> tuple[Weights, float]:
    """(per tensor of ``returned``: the float delta times ``clip_factor``, zeros for integer
    tensors and for tensors ``sent`` lacks, all float64; the delta's L2 norm before clipping)."""
    norm = delta_l2(sent, returned)
    scale = clip_factor(norm, clip)
    floats = set(float_names(sent, returned))
    out = {k: scale * (np.asarray(v, np.float64) - np.asarray(sent[k], np.float64)) if k in floats
           else np.zeros(np.shape(v), np.float64) for k, v in returned.items()}
    return out, norm


def noised_delta(sent: Weights, returned: Weights, clip: float, std: float,
                 rng: np.random.Generator | None = None) -> Weights:
    """``clip_delta`` plus N(0, std²) on every float element of the delta (local DP)."""
    rng = rng if rng is not None else np.random.default_rng()
    clipped, _ = clip_delta(sent, returned, clip)
    for k in float_names(sent, returned):
        value = np.asarray(clipped[k], np.float64) + rng.normal(0.0, std, size=np.shape(clipped[k]))
        clipped[k] = value.astype(clipped[k].dtype)
    return clipped


def noised_label_counts(y: np.ndarray, classes: int, epsilon: float,
                        rng: np.random.Generator | None = None) -> list[int]:
    """Counts of labels 0..classes-1 in ``y``, each plus Laplace(1/epsilon), rounded, >= 0."""
    rng = rng if rng is not None else np.random.default_rng()
    labels = np.asarray(y, np.int64)
    counts = np.bincount(labels[(labels >= 0) & (labels < classes)], minlength=classes).astype(np.float64)
    noisy = counts + rng.laplace(0.0, 1.0 / epsilon, size=classes)
    return [int(c) for c in np.maximum(np.rint(noisy), 0)]
