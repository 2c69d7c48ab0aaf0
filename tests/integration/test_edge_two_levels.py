"""Two levels of generic edges over a real mosquitto: an edge whose group holds a device and
another edge (HeteroFL, three widths), beside a device talking to the server directly.

    server ── dev3 (0.5)
          └── edge-a ── dev0 (0.5)
                     └── edge-b ── dev1 (1.0), dev2 (0.25)

After one round the server's checkpoint equals HeteroFL's flat aggregate of the four devices'
updates, read from the registries of whoever received them (the server for dev3, edge-a for
dev0, edge-b for dev1 and dev2).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.checkpoint import load_checkpoint
from server_toolkit.sim.simulate import start_device_process, stop_processes

from .harness import Fleet, device_updates

pytestmark = pytest.mark.integration


def start_edge(broker_url: str, fleet: str, edge_id: str, edge_dir, members: dict) -> subprocess.Popen:
    from server_toolkit.fleet.registry import FleetRegistry

    registry = FleetRegistry(edge_dir / "registry.sqlite")
    for dev, tier in members.items():
        registry.add_device(dev, tier=tier)
    registry.close()
    cmd = [sys.executable, "-m", "server_toolkit.cli", "-v", "edge", "--broker", broker_url, "--fleet", fleet,
           "--edge-id", edge_id, "--run-dir", str(edge_dir), "--method", "heterofl",
           "--min-devices", str(len(members))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(edge_dir / "edge.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def test_an_edge_of_edges_gives_the_flat_aggregate(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path, fleet="lab")
    tiers = {"dev0": "0.5", "dev1": "1.0", "dev2": "0.25", "dev3": "0.5"}
    where = {"dev0": "lab.edge-a", "dev1": "lab.edge-a.edge-b", "dev2": "lab.edge-a.edge-b", "dev3": "lab"}
    paths = fleet.write_data(list(tiers))
    procs = []
    try:
        fleet.registry.add_device("edge-a")
        fleet.registry.add_device("dev3", tier="0.5")
        procs.append(start_edge(mosquitto.url, "lab", "edge-a", tmp_path / "edge-a",
                                {"dev0": "0.5", "edge-b": None}))
        procs.append(start_edge(mosquitto.url, "lab.edge-a", "edge-b", tmp_path / "edge-b",
                                {"dev1": "1.0", "dev2": "0.25"}))
        for dev, path in paths.items():
            procs.append(start_device_process(mosquitto.url, where[dev], dev, path, tmp_path / dev / "work",
                                              tmp_path / f"{dev}.log"))
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        method = HeteroFL(spec, Recipe(epochs=1, batch_size=16, lr=0.05))
        loop = fleet.server(rounds=1, method=method, round_timeout_s=150)
        loop.start()
        start = dict(loop.global_weights)
        assert loop.grid.wait_for_devices(2, timeout_s=150) == 2
        (row,) = loop.run()
        loop.grid.close()
    finally:
        stop_processes(procs)
        fleet.close()
    assert row["accepted"] == 2 and row["rejected"] == 0, row
    server_run = tmp_path / "server"
    direct = [u for u in device_updates(server_run, 1) if u.device_id == "dev3"]
    updates = direct + [u for u in device_updates(tmp_path / "edge-a", 1) if u.device_id == "dev0"] \
        + device_updates(tmp_path / "edge-b", 1)
    assert sorted(u.device_id for u in updates) == ["dev0", "dev1", "dev2", "dev3"]
    assert {u.device_id: u.instruction.context["ratio"] for u in updates} == {
        "dev0": 0.5, "dev1": 1.0, "dev2": 0.25, "dev3": 0.5}
    flat = HeteroFL(spec, Recipe()).aggregate_train(1, start, updates)
    _, served, _ = load_checkpoint(server_run)
    for name in flat:
        np.testing.assert_allclose(served[name], flat[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(flat[n], start[n]) for n in flat)
