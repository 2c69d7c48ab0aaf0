"""The edge's relay method: warm-up clustering, per-cluster aggregation, projection stage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.methods.fedconv.relay import (
    TRAIN,
    WARMUP,
    EdgeOptions,
    EdgeRelay,
    ForwardedTask,
    final_linear,
)
from server_toolkit.reconstruct.average import weighted_average

K, F = 3, 6
RECIPE = Recipe(epochs=5, batch_size=16, lr=0.05)


def model(rng, head: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "layers.0.weight": rng.normal(0, 1, (F, 4)).astype(np.float32),
        "layers.0.bias": rng.normal(0, 1, F).astype(np.float32),
        "layers.1.head.0.weight": rng.normal(0, 1, (K, F)).astype(np.float32),  # an exit: never "final"
        "layers.2.weight": head[:, :F].astype(np.float32),
        "layers.2.bias": head[:, F].astype(np.float32),
    }


def updates_of(relay, rng, groups, smashed=False):
    """Two planted groups of 3 devices whose last layers differ; smashed data when asked."""
    out = []
    devices = [DeviceInfo(f"d{i}", 40) for i in range(6)]
    for instruction in relay.configure_train(1, relay.task.weights, devices):
        i = int(instruction.device_id[1:])
        head = groups[i // 3] + rng.normal(0, 0.05, groups[0].shape)
        others = {}
        if smashed:
            assert instruction.reports["features"] == {"samples": 30}
            y = rng.integers(0, K, 30)
            others["features"] = {"x": (np.eye(K, F)[y] * 3 + rng.normal(0, 0.3, (30, F))).astype(np.float32),
                                  "y": y}
        out.append(ClientUpdate(instruction.device_id, 40 + 10 * i, model(rng, head), {"samples": 40},
                                instruction, others))
    return out


@pytest.fixture
def relay(one_torch_thread):
    rng = np.random.default_rng(0)
    relay = EdgeRelay(EdgeOptions(smashed_samples=30, pair_threshold=10.0, projection_epochs=3))
    template = TrainInstruction("", {"format": "torchspec/1"}, model(rng, np.zeros((K, F + 1))), RECIPE,
                                programs=(("torchspec/1", b"{}"),))
    relay.forward(ForwardedTask(template))
    return relay


def test_final_linear_is_the_last_top_level_layer():
    rng = np.random.default_rng(0)
    assert final_linear(model(rng, np.zeros((K, F + 1)))) == ("layers.2.weight", "layers.2.bias")
    with pytest.raises(ValueError):
        final_linear({"layers.0.weight": np.zeros((2, 1, 3, 3))})


def test_warmup_clusters_then_train_aggregates(relay):
    rng = np.random.default_rng(1)
    groups = [rng.normal(0, 2, (K, F + 1)), rng.normal(0, 2, (K, F + 1))]
    assert relay.needs_warmup()
    relay.phase = WARMUP
    warm = updates_of(relay, rng, groups)
    assert all(u.instruction.recipe.epochs == 1 and "features" not in u.instruction.reports for u in warm)
    assert all(u.instruction.programs == (("torchspec/1", b"{}"),) for u in warm)  # forwarded as is
    assert relay.aggregate_train(1, relay.task.weights, warm) is relay.task.weights  # warm-up models dropped
    assert relay.summary["edge_clusters"] == 2 and not relay.needs_warmup()
    assert relay.clusters["d0"] == relay.clusters["d1"] == relay.clusters["d2"] != relay.clusters["d3"]

    relay.phase = TRAIN
    trained = updates_of(relay, rng, groups, smashed=True)
    assert all(u.instruction.recipe == RECIPE for u in trained)
    out = relay.aggregate_train(2, relay.task.weights, trained)
    plain = weighted_average([(u.weights, u.num_samples) for u in trained])
    assert relay.summary["edge_pairs"] == 1
    assert relay.summary["projection_loss_after"] < relay.summary["projection_loss_before"]
    for name in plain:  # the body is the group's FedAvg; only the final linear layer was tuned
        if name.startswith("layers.2."):
            assert not np.allclose(out[name], plain[name])
        else:
            np.testing.assert_allclose(out[name], plain[name], rtol=1e-6, atol=1e-6)
        assert out[name].shape == plain[name].shape and out[name].dtype == plain[name].dtype


def test_without_smashed_data_the_edge_sends_fedavg(relay):
    rng = np.random.default_rng(2)
    groups = [rng.normal(0, 2, (K, F + 1)), rng.normal(0, 2, (K, F + 1))]
    relay.phase = WARMUP
    relay.aggregate_train(1, relay.task.weights, updates_of(relay, rng, groups))
    relay.phase = TRAIN
    trained = updates_of(relay, rng, groups)  # devices that could not send smashed data
    out = relay.aggregate_train(2, relay.task.weights, trained)
    plain = weighted_average([(u.weights, u.num_samples) for u in trained])
    assert all(np.allclose(out[n], plain[n], atol=1e-6) for n in plain) and relay.summary["edge_pairs"] == 0


def test_state_survives_a_restart_and_newcomers_join_the_nearest_cluster(relay):
    rng = np.random.default_rng(3)
    groups = [rng.normal(0, 2, (K, F + 1)), rng.normal(0, 2, (K, F + 1))]
    relay.phase = WARMUP
    warm = updates_of(relay, rng, groups)
    relay.aggregate_train(1, relay.task.weights, warm[1:])  # d0 missed the warm-up
    again = EdgeRelay(relay.options)
    again.load_state_dict(json.loads(json.dumps(relay.state_dict())))  # as checkpoints keep it
    again.forward(relay.task)
    assert not again.needs_warmup() and "d0" not in again.clusters
    again.aggregate_train(2, relay.task.weights, updates_of(again, rng, groups))
    assert again.clusters["d0"] == again.clusters["d1"]
