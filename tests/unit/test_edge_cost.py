"""What an edge (and the server) no longer redoes per update (issue 31, BENCHMARKS.md "An edge's
CPU per update"): a round's shared weights are encoded once, an accepted result's checked
tensors are not decoded again from the blob store, and FedAvg's fold takes a shortcut that
gives the very same sums."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.edge.partial import Partial
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import TrainInstruction
from server_toolkit.methods.summands import Summand, whole
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.task_records import stored_update


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}


def test_a_grid_encodes_one_weights_dict_once_and_another_dict_anew(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    try:
        grid = MqttGrid(None, registry)
        shared = _weights(0)
        first = grid._encode(shared)
        assert grid._encode(shared) is first  # the second device's task: no new encoding
        assert decode_tensors(first)["w"].tobytes() == shared["w"].tobytes()
        other = _weights(1)
        assert grid._encode(other) == encode_tensors(other)
        for seed in range(2, 8):
            grid._encode(_weights(seed))
        assert len(grid._encoded) <= 4  # async grids send outside an exchange: bounded
    finally:
        registry.close()


def test_an_accepted_update_is_built_from_its_checked_tensors_without_reading_the_store(tmp_path):
    store, registry = BlobStore(tmp_path / "blobs"), FleetRegistry(tmp_path / "registry.sqlite")
    try:
        row = {"device_id": "d1", "task_id": "t1", "blob_id": "a" * 64, "num_samples": 3,
               "metrics": {"arrays": {"coverage": "c" * 64}, "loss": 0.5}}
        instruction = TrainInstruction("d1", {}, _weights(0), Recipe())
        checked = {"model": _weights(2), "coverage": _weights(3)}
        update = stored_update(row, instruction, registry, store, checked)
        assert update.weights is checked["model"] and update.others == {"coverage": checked["coverage"]}
        assert update.metrics == {"loss": 0.5} and update.num_samples == 3
        with pytest.raises(FileNotFoundError):  # without them: read from the store, which lacks the blobs
            stored_update(row, instruction, registry, store)
    finally:
        registry.close()


def test_fedavgs_whole_tensor_fold_gives_the_same_sums_bit_for_bit_as_the_general_fold():
    glob = _weights(0)
    updates = [(_weights(seed), float(seed + 1)) for seed in range(1, 6)]
    fast, general = Partial(), Partial()
    for weights, samples in updates:
        fast.add(glob, whole(weights, samples))  # scalar weight, whole tensors: the shortcut
        general.add(glob, {k: Summand(v, (), np.array([samples])) for k, v in weights.items()})  # broadcast
    for name in glob:
        assert fast.sums[name].tobytes() == general.sums[name].tobytes()
        assert fast.cover[name].tobytes() == general.cover[name].tobytes()
    with pytest.raises(ValueError, match="do not fit"):
        fast.add(glob, whole({"w": np.zeros((3, 4), np.float32)}, 1.0))
