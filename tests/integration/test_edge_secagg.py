"""Edges + secure aggregation over a real mosquitto, as ``simulate --edges 2 --secagg`` runs it:
two real ``fedsdk-server edge --method fedavg --secagg`` processes, each serving three real
device processes on digits. Every group round is a secure aggregation at its edge (the edge
persists no device update: it never held one in the clear), each server round folds the two
edges' group sums, and the run ends above the accuracy written here."""

from __future__ import annotations

import json

import pytest

from fedcore.recipe import Recipe
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

ACCURACY = 0.5  # digits, 6 devices, 3 rounds of 2 epochs (plain edges reached 0.70 here)


def test_two_secure_edges_of_three_devices_train_digits_and_never_hold_a_device_update(mosquitto, tmp_path):
    secagg = {"threshold": 0.5, "neighbours": None, "stage_timeout_s": 30.0}
    config = SimulationConfig(method="fedavg", devices=6, rounds=3, edges=2, partition="iid", seed=0,
                              recipe=Recipe(epochs=2, batch_size=16, lr=0.05, momentum=0.9).to_dict(),
                              device_runtime="torch", broker_url=mosquitto.url, fleet="lab",
                              round_timeout_s=60.0, secagg=secagg)
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["accepted"] for r in rows] == [2, 2, 2], rows  # one group sum per edge and round
    assert rows[-1]["accuracy"] >= ACCURACY, rows
    for edge in ("edge-1", "edge-2"):
        registry = FleetRegistry(run_dir / "edges" / edge / "registry.sqlite")
        try:  # group rounds ran, secure ones: no device update was ever stored at the edge
            assert all(registry.round_info(r) is not None and registry.updates(r) == [] for r in (1, 2, 3))
        finally:
            registry.close()
        log = (run_dir / "edges" / edge / "edge.log").read_text()
        assert "secagg reveal from 3/3 devices" in log  # every group round unmasked its three devices
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["edges"] == 2
