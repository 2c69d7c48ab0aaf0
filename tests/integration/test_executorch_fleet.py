"""Devices that train with ExecuTorch in a federated run over a real mosquitto.

Four device processes are restricted to ``--runtime executorch``; the server offers each
task as ``torchspec/1`` and ``pte/1`` programs (the .pte exported once per architecture).
The run must reach the accuracy band of the torch runtime on the same seed and
partition (FedAvg, three rounds, computed in-process with the torch runtime).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import partition
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

DEVICES, ROUNDS, SEED = 4, 3, 0
RECIPE = Recipe(epochs=3, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)


def _torch_reference_accuracy() -> float:
    """Final accuracy of the same federation run in-process with the torch runtime."""
    data = load_dataset("digits", seed=SEED)
    parts = partition(data.y_train, DEVICES, "iid", seed=SEED)
    devices = [LocalDevice(DeviceInfo(f"dev{i:03d}", len(idx)), data.x_train[idx], data.y_train[idx])
               for i, idx in enumerate(parts)]
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    result = run_rounds(FedAvg(spec, RECIPE), devices, ROUNDS, (data.x_test, data.y_test), seed=SEED)
    return result.rows[-1]["accuracy"]


def test_executorch_devices_reach_the_torch_accuracy_band(mosquitto, tmp_path):
    config = SimulationConfig(method="fedavg", model="small_cnn", devices=DEVICES, rounds=ROUNDS,
                              partition="iid", recipe=RECIPE.to_dict(), broker_url=mosquitto.url,
                              round_timeout_s=80, seed=SEED, program_formats=["torchspec/1", "pte/1"],
                              device_runtime="executorch")
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert all(r["accepted"] == DEVICES and r["rejected"] == 0 for r in rows), rows

    registry = FleetRegistry(run_dir / "registry.sqlite")
    try:
        for rnd in range(1, ROUNDS + 1):
            updates = registry.updates(rnd)
            assert len(updates) == DEVICES
            assert {u["metrics"]["runtime"] for u in updates} == {"executorch"}
            assert all(np.isfinite(u["metrics"]["loss"]) for u in updates)
    finally:
        registry.close()

    reference = _torch_reference_accuracy()
    final = rows[-1]["accuracy"]
    assert final >= 0.85, rows
    assert abs(final - reference) <= 0.05, (final, reference)
