"""Local and FedAvg-per-architecture baselines, and the server's personal evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.hypernet.fedavg_groups import FedAvgGroups
from server_toolkit.methods.hypernet.local import Local
from server_toolkit.models.architectures import architecture
from server_toolkit.models.personal_eval import label_weighted_accuracy, label_weights
from server_toolkit.models.zoo import model_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = model_spec("lenet", (1, 8, 8), 10)
DEVICES = [DeviceInfo("a", 10, "lenet"), DeviceInfo("b", 30, "lenet"), DeviceInfo("c", 20, "resnet10")]


def updates_of(instructions, value):
    return [ClientUpdate(i.device_id, d.num_samples, {k: np.full_like(v, value[i.device_id])
                                                      for k, v in i.weights.items()}, {}, i)
            for i, d in zip(instructions, DEVICES, strict=True)]


def test_local_gives_each_device_back_its_own_model():
    m = Local(SPEC, Recipe())
    weights = m.initial_weights(0)
    first = m.configure_train(1, weights, DEVICES)
    assert not any("running" in k for k in first[2].weights)  # BN statistics stay on the device
    assert not np.array_equal(first[0].weights["layers.0.weight"], first[1].weights["layers.0.weight"])
    weights = m.aggregate_train(1, weights, updates_of(first, {"a": 1.0, "b": 2.0, "c": 3.0}))
    again = {i.device_id: i for i in m.configure_train(2, weights, DEVICES)}
    assert all(np.all(again[d].weights["layers.0.weight"] == v) for d, v in (("a", 1), ("b", 2), ("c", 3)))
    arch, params = m.personal_model("b")
    assert arch.name == "lenet" and np.all(params["layers.0.weight"] == 2.0)


def test_fedavg_groups_average_within_an_architecture_only():
    m = FedAvgGroups(SPEC, Recipe())
    weights = m.initial_weights(0)
    first = m.configure_train(1, weights, DEVICES)
    assert np.array_equal(first[0].weights["layers.0.weight"], first[1].weights["layers.0.weight"])
    weights = m.aggregate_train(1, weights, updates_of(first, {"a": 1.0, "b": 2.0, "c": 3.0}))
    again = {i.device_id: i for i in m.configure_train(2, weights, DEVICES)}
    np.testing.assert_allclose(again["a"].weights["layers.0.weight"], 1.75)  # (10 * 1 + 30 * 2) / 40
    np.testing.assert_allclose(again["c"].weights["layers.0.weight"], 3.0)  # resnet10's group alone
    assert set(weights) == {f"lenet/{n}" for n, _ in architecture("lenet", (1, 8, 8), 10).parameters} | {
        f"resnet10/{n}" for n, _ in architecture("resnet10", (1, 8, 8), 10).parameters}


def test_label_weights_follow_the_device_distribution():
    y = np.array([0, 0, 0, 1, 2])
    w = label_weights(y, [3, 1])  # the device: 75% class 0, 25% class 1, no class 2
    np.testing.assert_allclose(w, [0.25, 0.25, 0.25, 0.25, 0.0])
    np.testing.assert_allclose(label_weights(y, None), 0.2)
    np.testing.assert_allclose(label_weights(y, [0, 0, 0, 5]), 0.2)  # nothing in common: uniform


def test_label_weighted_accuracy_scores_the_classes_the_device_has():
    arch = architecture("mlp", (1, 8, 8), 10)
    params = {name: np.zeros(shape, np.float32) for name, shape in arch.parameters}
    params["layers.5.bias"][3] = 1.0  # always predicts class 3
    x = np.zeros((20, 1, 8, 8), np.float32)
    y = np.repeat(np.arange(10), 2)
    assert label_weighted_accuracy(arch, params, x, y, None) == pytest.approx(0.1)
    assert label_weighted_accuracy(arch, params, x, y, [0, 0, 0, 9, 1]) == pytest.approx(0.9)


def test_evaluate_reports_mean_min_and_per_architecture_accuracy():
    from server_toolkit.data.datasets import load_dataset

    data = load_dataset("digits", seed=0)
    m = FedAvgGroups(SPEC, Recipe())
    weights = m.initial_weights(0)
    first = m.configure_train(1, weights, DEVICES)
    updates = [ClientUpdate(i.device_id, 10, i.weights, {"label_counts": [5, 5]}, i) for i in first]
    weights = m.aggregate_train(1, weights, updates)
    m.aggregate_evaluate(1, updates)
    assert m.label_counts == {d: [5, 5] + [0] * 8 for d in "abc"}
    out = m.evaluate(weights, data.x_test, data.y_test)
    assert out["personal_devices"] == 3 and 0 <= out["accuracy_min"] <= out["accuracy"] <= 1
    assert {"accuracy_lenet", "accuracy_resnet10"} <= set(out)
