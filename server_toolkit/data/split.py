"""Seeded, label-stratified index splits (train/test, devices/server)."""

from __future__ import annotations

import numpy as np


def stratified_split(
    y: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per label, put round(count * test_fraction) shuffled samples in the second part.

    ``y``: (N,) integer labels. Returns (train, test) int64 index arrays, each shuffled,
    together a permutation of range(N)."""
    train_parts, test_parts = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(len(idx) * test_fraction))
        test_parts.append(idx[:n_test])
        train_parts.append(idx[n_test:])
    train = rng.permutation(np.concatenate(train_parts)).astype(np.int64)
    test = rng.permutation(np.concatenate(test_parts)).astype(np.int64)
    return train, test


def stratified_subset(y: np.ndarray, count: int, seed: int) -> np.ndarray:
    """Sorted indices of about ``count`` samples of (N,) labels ``y``, each label keeping its
    share (seeded); all of them when ``count`` >= N."""
    if count >= len(y):
        return np.arange(len(y), dtype=np.int64)
    if count < 1:
        raise ValueError(f"a subset needs at least one sample, got {count}")
    _, kept = stratified_split(y, count / len(y), np.random.default_rng(seed))
    return np.sort(kept)
