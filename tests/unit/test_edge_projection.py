"""The cross-cluster projection stage (Eq. 8) on synthetic smashed data."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.fedconv.clustering import layer_distribution
from server_toolkit.methods.fedconv.projection import Head, run_stage, select_pairs

RECIPE = Recipe(epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)


def head(rng, class_means, labels, scale=0.05):
    """Smashed data around ``class_means`` (K, F) and an untrained-ish head."""
    x = class_means[labels] + rng.normal(0, 0.5, (len(labels), class_means.shape[1]))
    k, f = class_means.shape
    return Head(rng.normal(0, scale, (k, f)).astype(np.float32), np.zeros(k, np.float32),
                x.astype(np.float32), labels.astype(np.int64))


@pytest.fixture
def heads(one_torch_thread):
    rng = np.random.default_rng(0)
    means = rng.normal(0, 2, (3, 8))
    return {
        0: head(rng, means, rng.choice([0, 1], 60, p=[0.7, 0.3])),
        1: head(rng, means, rng.choice([1, 2], 50, p=[0.4, 0.6])),
        2: head(rng, means, rng.choice([0, 2], 40)),
    }


def test_stage_lowers_the_loss_and_touches_only_paired_heads(heads):
    before = {c: (h.weight.copy(), h.bias.copy()) for c, h in heads.items()}
    result = run_stage(heads, [(0, 1)], RECIPE, lam=0.5, epochs=3)
    assert result.pair_loss_after < result.pair_loss_before
    assert result.head_loss_after < result.head_loss_before  # the F's alone got better too
    assert set(result.heads) == {0, 1}  # cluster 2 has no pair: untouched
    for c in (0, 1):
        weight, bias = result.heads[c]
        assert weight.shape == heads[c].weight.shape and weight.dtype == np.float32
        assert not np.array_equal(weight, before[c][0])
        assert np.isfinite(weight).all() and np.isfinite(bias).all()
    for c, h in heads.items():  # the inputs are not modified in place
        assert np.array_equal(h.weight, before[c][0]) and np.array_equal(h.bias, before[c][1])


def test_stage_without_pairs_changes_nothing(heads):
    result = run_stage(heads, [], RECIPE)
    assert result.heads == {} and result.pair_loss_before == result.pair_loss_after == 0.0


def test_stage_is_seeded(heads):
    a = run_stage(heads, [(0, 1), (1, 2)], RECIPE, epochs=1)
    b = run_stage(heads, [(0, 1), (1, 2)], RECIPE, epochs=1)
    assert all(np.array_equal(a.heads[c][0], b.heads[c][0]) for c in a.heads)


def test_select_pairs_links_close_clusters_only():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, 30)
    clients = np.array([layer_distribution(base + rng.normal(0, 1.0, 30)) for _ in range(6)])
    near = [layer_distribution(base + rng.normal(0, 0.05, 30)) for _ in range(2)]
    far = layer_distribution(base + rng.normal(0, 4.0, 30))  # farther than a typical client pair
    pairs = select_pairs({0: near[0], 1: near[1], 2: far}, clients, threshold=1.0)
    assert pairs == [(0, 1)]
    assert select_pairs({0: near[0]}, clients) == []
    assert select_pairs({0: near[0], 1: near[1], 2: far}, clients, threshold=0.0) == []


def test_lambda_out_of_range_is_refused(heads):
    with pytest.raises(ValueError):
        run_stage(heads, [(0, 1)], RECIPE, lam=1.5)
