"""Unit tests of server_toolkit.sim.partition on the real digits labels (fast, no torch)."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from server_toolkit.sim.partition import (
    PartitionError,
    dirichlet,
    iid,
    k_classes,
    label_histogram,
    partition,
    quantity_skew,
)

LABELS = np.asarray(load_digits().target, dtype=np.int64)  # 1797 labels, 10 classes
N = len(LABELS)


def _assert_disjoint_cover(parts: list[np.ndarray], n: int = N) -> None:
    for part in parts:
        assert part.dtype == np.int64 and part.ndim == 1
    everything = np.concatenate(parts)
    assert len(everything) == len(np.unique(everything)), "an index is used twice"
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))


def _mean_label_entropy(parts: list[np.ndarray]) -> float:
    hist = label_histogram(LABELS, parts, 10).astype(np.float64)
    p = hist / hist.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return float(terms.sum(axis=1).mean())


SCHEME_KWARGS = {
    "iid": {},
    "dirichlet": {"alpha": 0.3, "min_size": 10},
    "k-classes": {"classes_per_client": 2},
    "quantity-skew": {"num_strong": 2, "strong_share": 0.6, "alpha": 0.5},
}


@pytest.mark.parametrize("scheme", list(SCHEME_KWARGS))
def test_every_scheme_is_disjoint_and_covers(scheme: str) -> None:
    parts = partition(LABELS, 10, scheme, seed=3, **SCHEME_KWARGS[scheme])
    assert len(parts) == 10
    _assert_disjoint_cover(parts)


@pytest.mark.parametrize("scheme", list(SCHEME_KWARGS))
def test_same_seed_same_parts_other_seed_differs(scheme: str) -> None:
    a = partition(LABELS, 8, scheme, seed=11, **SCHEME_KWARGS[scheme])
    b = partition(LABELS, 8, scheme, seed=11, **SCHEME_KWARGS[scheme])
    c = partition(LABELS, 8, scheme, seed=12, **SCHEME_KWARGS[scheme])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_near_equal_and_label_mix_balanced() -> None:
    parts = iid(LABELS, 7, np.random.default_rng(0))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == N
    hist = label_histogram(LABELS, parts, 10)
    assert hist.min() > 0  # every client sees every class
    assert _mean_label_entropy(parts) > 0.95 * np.log(10)


def test_dirichlet_small_alpha_more_skewed_than_large_alpha() -> None:
    skewed = partition(LABELS, 10, "dirichlet", seed=0, alpha=0.1, min_size=5)
    uniform = partition(LABELS, 10, "dirichlet", seed=0, alpha=100.0, min_size=5)
    assert _mean_label_entropy(skewed) < _mean_label_entropy(uniform) - 0.5
    assert _mean_label_entropy(uniform) > 0.95 * np.log(10)


def test_dirichlet_respects_min_size() -> None:
    for seed in range(5):
        parts = dirichlet(LABELS, 20, np.random.default_rng(seed), alpha=0.2, min_size=30)
        assert min(len(p) for p in parts) >= 30
        _assert_disjoint_cover(parts)


def test_dirichlet_impossible_min_size_raises() -> None:
    with pytest.raises(PartitionError, match="exceeds the 1797 samples"):
        partition(LABELS, 10, "dirichlet", min_size=200)
    # Feasible on paper but hopeless with such a tiny alpha: bounded retries then an error.
    with pytest.raises(PartitionError, match="tries"):
        partition(LABELS, 50, "dirichlet", alpha=0.01, min_size=35)


def test_dirichlet_rejects_bad_alpha() -> None:
    with pytest.raises(PartitionError, match="alpha"):
        partition(LABELS, 4, "dirichlet", alpha=0.0)


@pytest.mark.parametrize(("num_clients", "k"), [(10, 2), (7, 3), (5, 2), (4, 10)])
def test_k_classes_gives_exactly_k_classes(num_clients: int, k: int) -> None:
    parts = k_classes(LABELS, num_clients, np.random.default_rng(5), classes_per_client=k)
    hist = label_histogram(LABELS, parts, 10)
    assert ((hist > 0).sum(axis=1) == k).all()
    _assert_disjoint_cover(parts)  # num_clients * k >= 10 in every case, so all classes used


def test_k_classes_splits_each_class_evenly() -> None:
    parts = partition(LABELS, 10, "kclasses", seed=2, classes_per_client=2)
    hist = label_histogram(LABELS, parts, 10)
    for c in range(10):
        holders = hist[:, c][hist[:, c] > 0]
        assert len(holders) == 2
        assert holders.max() - holders.min() <= 1


def test_k_classes_rejects_bad_k() -> None:
    with pytest.raises(PartitionError, match="classes_per_client"):
        partition(LABELS, 5, "k-classes", classes_per_client=11)
    with pytest.raises(PartitionError, match="classes_per_client"):
        partition(LABELS, 5, "k-classes", classes_per_client=0)


@pytest.mark.parametrize(("num_strong", "share"), [(1, 0.5), (2, 0.6), (3, 0.3)])
def test_quantity_skew_strong_clients_hold_their_share(num_strong: int, share: float) -> None:
    parts = quantity_skew(LABELS, 10, np.random.default_rng(1), num_strong, share, alpha=0.5)
    _assert_disjoint_cover(parts)
    strong_sizes = [len(p) for p in parts[:num_strong]]
    weak_sizes = [len(p) for p in parts[num_strong:]]
    assert sum(strong_sizes) / N == pytest.approx(share, abs=1e-3)
    assert max(strong_sizes) - min(strong_sizes) <= 1
    assert max(weak_sizes) - min(weak_sizes) <= 1


def test_quantity_skew_strong_iid_weak_skewed() -> None:
    parts = partition(LABELS, 10, "quantity-skew", seed=4, num_strong=2, strong_share=0.5,
                      alpha=0.1)
    strong_entropy = _mean_label_entropy(parts[:2])
    weak_entropy = _mean_label_entropy(parts[2:])
    assert strong_entropy > 0.95 * np.log(10)
    assert weak_entropy < strong_entropy - 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_strong": 0}, "num_strong"),
        ({"num_strong": 10}, "num_strong"),
        ({"strong_share": 0.0}, "strong_share"),
        ({"strong_share": 1.0}, "strong_share"),
    ],
)
def test_quantity_skew_validates(kwargs: dict, message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        partition(LABELS, 10, "quantity-skew", **kwargs)


def test_label_histogram_counts() -> None:
    labels = np.array([0, 0, 1, 2, 2, 2])
    hist = label_histogram(labels, [np.array([0, 3]), np.array([1, 2, 4, 5])], 4)
    np.testing.assert_array_equal(hist, [[1, 0, 1, 0], [1, 1, 2, 0]])
    assert hist.shape == (2, 4)
    with pytest.raises(PartitionError, match="outside"):
        label_histogram(labels, [np.arange(6)], 2)


def test_unknown_scheme_and_bad_inputs() -> None:
    with pytest.raises(PartitionError) as err:
        partition(LABELS, 4, "pathological")
    assert isinstance(err.value, ValueError)
    for name in ("iid", "dirichlet", "k-classes", "quantity-skew"):
        assert name in str(err.value)
    with pytest.raises(PartitionError, match="num_clients"):
        partition(LABELS, 0)
    with pytest.raises(PartitionError, match="integer"):
        partition(LABELS.astype(np.float32), 4)
