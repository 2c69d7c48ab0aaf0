"""FedAvgM: server momentum on the averaged pseudo-gradient (synthetic weights: pure maths)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate
from server_toolkit.models.zoo import model_spec

SPEC = model_spec("small_cnn", (1, 8, 8), 10)


def _updates(weights: dict, shift: float) -> list[ClientUpdate]:
    """Two devices whose mean moves every float tensor by ``shift``."""
    return [ClientUpdate(f"d{i}", 10, {k: v + shift + (i - 0.5) for k, v in weights.items()}, {}, None)
            for i in range(2)]


def test_with_beta_zero_fedavgm_is_fedavg():
    fedavgm = method_class("fedavgm")(SPEC, Recipe(), beta=0.0)
    fedavg = method_class("fedavg")(SPEC, Recipe())
    weights = fedavg.initial_weights(0)
    ours, theirs = weights, weights
    for rnd in (1, 2):
        ours = fedavgm.aggregate_train(rnd, ours, _updates(ours, 0.1))
        theirs = fedavg.aggregate_train(rnd, theirs, _updates(theirs, 0.1))
    assert all(np.allclose(ours[k], theirs[k], atol=1e-6) for k in weights)


def test_momentum_accumulates_a_constant_pseudo_gradient_and_survives_a_restart():
    method = method_class("fedavgm")(SPEC, Recipe(), beta=0.5, server_lr=1.0)
    start = method.initial_weights(0)
    after_one = method.aggregate_train(1, start, _updates(start, 0.1))
    name = next(iter(start))
    assert np.allclose(after_one[name] - start[name], 0.1, atol=1e-6)  # v = delta
    again = method_class("fedavgm")(SPEC, Recipe(), beta=0.5)
    again.load_state_dict(json.loads(json.dumps(method.state_dict())))
    after_two = again.aggregate_train(2, after_one, _updates(after_one, 0.1))
    assert np.allclose(after_two[name] - after_one[name], 0.1 * 1.5, atol=1e-6)  # v = 0.5 v + delta


def test_bad_options_fail_with_a_clear_message():
    with pytest.raises(ValueError, match="beta"):
        method_class("fedavgm")(SPEC, Recipe(), beta=1.0)
