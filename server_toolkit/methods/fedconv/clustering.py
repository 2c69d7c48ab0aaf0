"""Clustering an edge's clients: K-means over their last layers, with KL divergence.

FedConv (seed 001, §IV-B) clusters the clients of an edge server once, before federated
training: every client trains the model for one epoch, the edge turns each returned last
linear layer into a probability vector and runs K-means with the KL divergence as the
distance. Where the paper is silent or contradicts itself we decided:

* **Probability vector.** ``softmax(concat(W.ravel(), b))`` of the final linear layer
  (weight (K, F) and bias (K,)), in float64. The bias is kept: it carries most of a client's
  label prior.
* **Direction of the divergence.** The paper once says "a higher KLD means more similar",
  and later links pairs whose KLD is *below* a threshold. We treat KLD as a divergence
  (lower = more similar). K-means uses KL(member ‖ centroid): it is a Bregman divergence in
  the member, so the arithmetic mean of the members is the exact minimiser and Lloyd's
  iterations never increase the objective. The silhouette and the pair rule need an
  order-free dissimilarity and use the symmetric KLD ½(KL(p‖q) + KL(q‖p)).
* **Choice of K** ("determined at runtime", no algorithm given): K-means for every
  K in 2 … min(``max_clusters``, n − 1), keep the K with the highest mean silhouette
  (symmetric KLD, ``sklearn.metrics.silhouette_score`` on the precomputed matrix). If that
  best silhouette is below ``min_silhouette`` (0.25: Kaufman & Rousseeuw's "no substantial
  structure"), or there are fewer than 3 clients, K = 1.
* **Restarts.** k-means++ seeding by KL(p ‖ chosen centres), ``n_init`` seeded restarts,
  lowest objective wins. An emptied cluster is re-seeded with the member farthest from its
  centroid.

Shapes: ``p`` arrays are (n, d) with rows summing to 1; centroids are (k, d).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EPS = 1e-12


def softmax_rows(vectors: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (n, d) values, in float64 (each row sums to 1)."""
    v = np.asarray(vectors, np.float64)
    v = v - v.max(axis=1, keepdims=True)
    e = np.exp(v)
    return e / e.sum(axis=1, keepdims=True)


def layer_distribution(weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """The probability vector of one linear layer: softmax over its weights and bias, (d,)."""
    flat = np.asarray(weight, np.float64).ravel()
    if bias is not None:
        flat = np.concatenate([flat, np.asarray(bias, np.float64).ravel()])
    return softmax_rows(flat[None, :])[0]


def kld_matrix(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(n, m) matrix of KL(p_i ‖ q_j) for rows of p (n, d) and q (m, d); never negative."""
    p = np.clip(np.asarray(p, np.float64), EPS, None)
    q = np.clip(np.asarray(q, np.float64), EPS, None)
    entropy_term = (p * np.log(p)).sum(axis=1, keepdims=True)  # (n, 1)
    out = entropy_term - p @ np.log(q).T
    return np.maximum(out, 0.0)


def symmetric_kld(p: np.ndarray, q: np.ndarray | None = None) -> np.ndarray:
    """(n, m) matrix of ½(KL(p_i‖q_j) + KL(q_j‖p_i)); with q None, the (n, n) matrix of p
    (zero diagonal)."""
    same = q is None
    q = p if q is None else q
    out = 0.5 * (kld_matrix(p, q) + kld_matrix(q, p).T)
    if same:
        np.fill_diagonal(out, 0.0)
    return out


@dataclass
class KMeansFit:
    """One K-means solution: ``labels`` (n,) in 0..k-1, ``centroids`` (k, d), ``objective``
    = Σ_i KL(p_i ‖ centroid of i)."""

    labels: np.ndarray
    centroids: np.ndarray
    objective: float


def kld_kmeans(p: np.ndarray, k: int, seed: int = 0, n_init: int = 10, max_iter: int = 100) -> KMeansFit:
    """K-means on probability rows ``p`` (n, d) with distance KL(p_i ‖ centroid)."""
    p = np.asarray(p, np.float64)
    n = len(p)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n}, got {k}")
    rng = np.random.default_rng(seed)
    best: KMeansFit | None = None
    for _ in range(n_init):
        fit = _lloyd(p, _kmeanspp(p, k, rng), max_iter)
        if best is None or fit.objective < best.objective - 1e-15:
            best = fit
    assert best is not None
    return best


def _kmeanspp(p: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [p[rng.integers(len(p))]]
    for _ in range(1, k):
        d = kld_matrix(p, np.array(centres)).min(axis=1)
        total = d.sum()
        pick = rng.choice(len(p), p=d / total) if total > 0 else rng.integers(len(p))
        centres.append(p[pick])
    return np.array(centres)


def _lloyd(p: np.ndarray, centroids: np.ndarray, max_iter: int) -> KMeansFit:
    k = len(centroids)
    labels = np.full(len(p), -1)
    for _ in range(max_iter):
        dist = kld_matrix(p, centroids)
        new_labels = dist.argmin(axis=1)
        for c in range(k):  # an emptied cluster takes the point farthest from its centroid
            if not (new_labels == c).any():
                own = dist[np.arange(len(p)), new_labels]
                far = int(own.argmax())
                new_labels[far] = c
        if (new_labels == labels).all():
            break
        labels = new_labels
        centroids = np.array([p[labels == c].mean(axis=0) for c in range(k)])
    objective = float(kld_matrix(p, centroids)[np.arange(len(p)), labels].sum())
    return KMeansFit(labels, centroids, objective)


@dataclass
class Clustering:
    """The chosen clustering: ``labels`` (n,), ``centroids`` (k, d), ``k``, and the mean
    silhouette of every K tried (``silhouettes``: K -> score)."""

    labels: np.ndarray
    centroids: np.ndarray
    k: int
    silhouettes: dict[int, float] = field(default_factory=dict)


def choose_clusters(p: np.ndarray, max_clusters: int = 8, min_silhouette: float = 0.25,
                    seed: int = 0) -> Clustering:
    """K-means for K = 2 … min(max_clusters, n−1), K by the best mean silhouette (see the
    module docstring); K = 1 when n < 3 or no K reaches ``min_silhouette``."""
    from sklearn.metrics import silhouette_score

    p = np.asarray(p, np.float64)
    n = len(p)
    one = Clustering(np.zeros(n, int), p.mean(axis=0, keepdims=True), 1)
    if n < 3 or max_clusters < 2:
        return one
    dissimilarity = symmetric_kld(p)
    scores: dict[int, float] = {}
    fits: dict[int, KMeansFit] = {}
    for k in range(2, min(max_clusters, n - 1) + 1):
        fit = kld_kmeans(p, k, seed=seed)
        if len(set(fit.labels.tolist())) < 2:
            continue
        fits[k] = fit
        scores[k] = float(silhouette_score(dissimilarity, fit.labels, metric="precomputed"))
    one.silhouettes = scores
    if not scores:
        return one
    best_k = max(scores, key=lambda k: (scores[k], -k))  # ties: fewer clusters
    if scores[best_k] < min_silhouette:
        return one
    fit = fits[best_k]
    return Clustering(fit.labels, fit.centroids, best_k, scores)


def nearest_centroid(p: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Cluster index (n,) of each row of ``p`` by the smallest KL(p_i ‖ centroid)."""
    return kld_matrix(np.atleast_2d(p), centroids).argmin(axis=1)
