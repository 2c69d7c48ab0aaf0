"""FedDM's client cooperation: a similarity tree over clients, and which layers each
level of the tree shares.

Similarity (the seed's S_ij, with its gaps settled):
``S_ij = KLsym(labels_i, labels_j) + lam * mean_b KLsym(softmax(f_i(x_b)), softmax(f_j(x_b)))``
where ``labels_i`` is client i's label distribution (counts + 1e-3 smoothing, normalised),
``f_i`` the model client i returned, evaluated on a small server-held reference batch
``x_b`` (so no client data leaves a device, and all clients are compared on the same
inputs), and ``KLsym(p, q) = (KL(p||q) + KL(q||p)) / 2``. Smaller S = more alike.

Tree: agglomerative clustering of the clients on S with average linkage (scipy).

Layers: the model's conv/linear layers in depth order are split into ``levels + 1``
contiguous groups of near-equal size (``numpy.array_split``). Group 0 (the shallow layers)
is shared by all clients, i.e. the global aggregate; group g >= 1 is shared within the
subtrees obtained by cutting the tree into ``min(n, 2^g)`` clusters, so deeper layers are
shared by smaller groups of more similar clients (FedDL's pattern, which the seed cites).
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

LABEL_SMOOTHING = 1e-3


def label_distributions(counts: np.ndarray) -> np.ndarray:
    """(n, K) label counts -> (n, K) smoothed probabilities (rows sum to 1)."""
    smoothed = np.asarray(counts, np.float64) + LABEL_SMOOTHING
    return smoothed / smoothed.sum(axis=1, keepdims=True)


def pairwise_symmetric_kl(probs: np.ndarray) -> np.ndarray:
    """Mean symmetric KL between every pair of clients: ``probs`` is (n, K) or (n, B, K)
    (B distributions per client, compared position by position); returns (n, n)."""
    p = np.clip(np.asarray(probs, np.float64), 1e-12, None)
    if p.ndim == 2:
        p = p[:, None, :]
    log_p = np.log(p)
    batch = p.shape[1]
    self_term = np.einsum("ibk,ibk->i", p, log_p) / batch  # mean_b sum_k p_i log p_i
    cross_term = np.einsum("ibk,jbk->ij", p, log_p) / batch  # mean_b sum_k p_i log p_j
    kl = self_term[:, None] - cross_term  # KL(i || j)
    return np.maximum((kl + kl.T) / 2, 0.0)


def client_distance(output_probs: np.ndarray, label_dists: np.ndarray | None, lam: float) -> np.ndarray:
    """S_ij as (n, n): label term (when ``label_dists`` is given) + ``lam`` * output term."""
    distance = lam * pairwise_symmetric_kl(output_probs)
    if label_dists is not None:
        distance = distance + pairwise_symmetric_kl(label_dists)
    np.fill_diagonal(distance, 0.0)
    return distance


def build_tree(distance: np.ndarray) -> np.ndarray:
    """Average-linkage agglomerative tree (scipy linkage matrix) over ``distance`` (n, n), n >= 2."""
    return linkage(squareform(distance, checks=False), method="average")


def subtree_labels(tree: np.ndarray, clusters: int) -> np.ndarray:
    """Cut ``tree`` into at most ``clusters`` subtrees; (n,) labels from 0."""
    return fcluster(tree, t=clusters, criterion="maxclust") - 1


def depth_levels(num_units: int, levels: int) -> list[int]:
    """Level (0 = global) of each of ``num_units`` layers in depth order, ``levels`` >= 0."""
    groups = np.array_split(np.arange(num_units), levels + 1)
    level_of = [0] * num_units
    for level, units in enumerate(groups):
        for unit in units:
            level_of[int(unit)] = level
    return level_of


def clusters_at(level: int, num_clients: int) -> int:
    """How many subtrees share a level-``level`` layer: ``min(n, 2^level)``."""
    return min(num_clients, 2 ** level)
