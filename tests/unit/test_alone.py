"""``alone`` (methods/alone.py): each tier's devices train their tier's model among themselves."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.models.zoo import model_spec

SPEC = model_spec("small_cnn", (1, 8, 8), 10)
BIG, SMALL, OTHER = DeviceInfo("a", 30, "1.0"), DeviceInfo("b", 10, "0.25"), DeviceInfo("c", 10, "1.0")


def trained(instruction, value: float, samples: int) -> ClientUpdate:
    """A device's update: every tensor of the task's model set to ``value``."""
    weights = {k: np.full_like(v, value) for k, v in instruction.weights.items()}
    return ClientUpdate(instruction.device_id, samples, weights, {}, instruction)


def test_each_tier_trains_the_model_it_deploys_under_the_heterogeneous_method():
    alone = method_class("alone")(SPEC, Recipe(), of="heterofl")
    heterofl = method_class("heterofl")(SPEC, Recipe())
    weights = alone.initial_weights(0)
    instructions = {i.device_id: i for i in alone.configure_train(1, weights, [BIG, SMALL])}
    for device in (BIG, SMALL):
        spec, window = heterofl.deployable(heterofl.initial_weights(0), device)
        sent = instructions[device.device_id]
        assert sent.spec == spec and set(sent.weights) == set(window)
        fresh = state_numpy(build_model(spec, seed=0))  # its own model's initial scale, not the window's
        assert all(np.array_equal(fresh[k], v) for k, v in sent.weights.items())
    assert sum(v.size for v in instructions["b"].weights.values()) < \
        sum(v.size for v in instructions["a"].weights.values())


def test_a_tier_averages_only_its_own_devices_updates():
    alone = method_class("alone")(SPEC, Recipe(), of="heterofl")
    weights = alone.initial_weights(0)
    sent = {i.device_id: i for i in alone.configure_train(1, weights, [BIG, SMALL, OTHER])}
    new = alone.aggregate_train(1, weights, [trained(sent["a"], 1.0, 30), trained(sent["c"], 5.0, 10),
                                             trained(sent["b"], -2.0, 10)])
    _, big = alone.deployable(new, BIG)
    _, small = alone.deployable(new, SMALL)
    assert all(np.allclose(v, 2.0) for v in big.values())  # (30 * 1 + 10 * 5) / 40
    assert all(np.allclose(v, -2.0) for v in small.values())
    assert alone.deployable(new, DeviceInfo("d", 10, "0.5")) is None  # never trained


def test_a_tier_that_sends_nothing_keeps_its_model():
    alone = method_class("alone")(SPEC, Recipe(), of="heterofl")
    sent = {i.device_id: i for i in alone.configure_train(1, alone.initial_weights(0), [BIG, SMALL])}
    first = alone.aggregate_train(1, {}, [trained(sent["a"], 1.0, 30), trained(sent["b"], 3.0, 10)])
    again = {i.device_id: i for i in alone.configure_train(2, first, [BIG])}
    second = alone.aggregate_train(2, first, [trained(again["a"], 4.0, 30)])
    assert all(np.allclose(v, 3.0) for v in alone.deployable(second, SMALL)[1].values())
    assert all(np.allclose(v, 4.0) for v in alone.deployable(second, BIG)[1].values())


def test_alone_refuses_to_be_its_own_method_and_names_an_unknown_one():
    with pytest.raises(ValueError, match="not 'alone'"):
        method_class("alone")(SPEC, Recipe(), of="alone")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        method_class("alone")(SPEC, Recipe(), of="nope")


def test_alone_refuses_a_method_that_trains_on_server_data():
    with pytest.raises(ValueError, match="use of=heterofl"):
        method_class("alone")(SPEC, Recipe(), of="fedconv")
