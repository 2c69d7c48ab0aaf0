"""KLD K-means and the silhouette choice of K (synthetic probability vectors)."""

from __future__ import annotations

import numpy as np
import pytest

from server_toolkit.methods.fedconv.clustering import (
    choose_clusters,
    kld_kmeans,
    kld_matrix,
    layer_distribution,
    nearest_centroid,
    softmax_rows,
    symmetric_kld,
)


def planted(groups: int, per_group: int, dim: int = 60, spread: float = 2.0, noise: float = 0.15,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Softmax rows around ``groups`` random centres; returns (p (n, dim), true group (n,))."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, spread, (groups, dim))
    truth = np.repeat(np.arange(groups), per_group)
    logits = centres[truth] + rng.normal(0, noise, (len(truth), dim))
    order = rng.permutation(len(truth))
    return softmax_rows(logits[order]), truth[order]


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = {(int(x), int(y)) for x, y in zip(a, b, strict=True)}
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_kld_matrix_is_kl_divergence():
    p = softmax_rows(np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]]))
    expected = np.array([[np.sum(p[i] * np.log(p[i] / p[j])) for j in range(2)] for i in range(2)])
    assert np.allclose(kld_matrix(p, p), expected)
    assert np.allclose(np.diag(kld_matrix(p, p)), 0)
    s = symmetric_kld(p)
    assert np.allclose(s, s.T) and s[0, 1] == pytest.approx(0.5 * (expected[0, 1] + expected[1, 0]))


def test_layer_distribution_sums_to_one_and_sees_the_bias():
    w = np.ones((3, 4), np.float32)
    a, b = layer_distribution(w, np.zeros(3)), layer_distribution(w, np.array([0.0, 0.0, 5.0]))
    assert a.shape == (15,) and a.sum() == pytest.approx(1.0)
    assert kld_matrix(a[None], b[None])[0, 0] > 0.1


@pytest.mark.parametrize("groups", [2, 3, 4])
def test_kmeans_recovers_planted_groups(groups):
    p, truth = planted(groups, 5, seed=groups)
    fit = kld_kmeans(p, groups, seed=0)
    assert same_partition(fit.labels, truth)
    assert np.allclose(fit.centroids.sum(axis=1), 1.0)  # centroids are distributions (means)


def test_silhouette_picks_the_planted_k():
    for groups in (2, 3, 4):
        p, truth = planted(groups, 4, seed=10 + groups)
        found = choose_clusters(p, max_clusters=8, seed=0)
        assert found.k == groups, found.silhouettes
        assert same_partition(found.labels, truth)
        assert max(found.silhouettes, key=found.silhouettes.get) == groups


def test_no_structure_gives_one_cluster():
    p, _ = planted(1, 12, spread=0.0, noise=0.3, seed=3)  # one blob: every K > 1 splits noise
    found = choose_clusters(p, seed=0)
    assert found.k == 1 and (found.labels == 0).all()
    assert max(found.silhouettes.values()) < 0.25
    assert choose_clusters(p[:2]).k == 1  # too few clients to score a split


def test_nearest_centroid_assigns_a_newcomer():
    p, truth = planted(3, 5, seed=7)
    found = choose_clusters(p, seed=0)
    newcomer, newcomer_truth = planted(3, 5, seed=7)  # same centres, same groups
    member = np.flatnonzero(truth == newcomer_truth[0])[0]
    assert nearest_centroid(newcomer[0], found.centroids)[0] == found.labels[member]
