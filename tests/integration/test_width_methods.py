"""HeteroFL, FedRolex and FedDM over a real mosquitto: four device processes in four tiers
(1.0, 0.75, 0.5, 0.25) run two rounds; every upload is exactly its sub-model's tensors."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.models.zoo import model_spec
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from server_toolkit.submodels.width import static_bn, width_layout

pytestmark = pytest.mark.integration

TIERS = ["1.0", "0.75", "0.5", "0.25"]
MODEL = "vgg_multi_exit"  # exit heads + BN: the hardest zoo model to cut


@pytest.mark.parametrize("method", ["heterofl", "fedrolex", "feddm"])
def test_four_tiers_complete_rounds_and_upload_only_their_sub_model(method, mosquitto, tmp_path):
    config = SimulationConfig(method=method, model=MODEL, devices=4, rounds=2, tiers=TIERS, partition="iid",
                              recipe=Recipe(epochs=1, batch_size=32, lr=0.02).to_dict(),
                              broker_url=mosquitto.url, round_timeout_s=60, seed=0)
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["accepted"] == 4 and r["rejected"] == 0 for r in rows), rows
    assert all(np.isfinite(r["accuracy"]) for r in rows)

    layout = width_layout(static_bn(model_spec(MODEL, (1, 8, 8), 10)))
    registry, store = FleetRegistry(run_dir / "registry.sqlite"), BlobStore(run_dir / "blobs")
    try:
        seen_tiers = set()
        for rnd in (1, 2):
            for update in registry.updates(rnd):
                tier = registry.device(update["device_id"])["tier"]
                seen_tiers.add(tier)
                sub_model = state_numpy(build_model(layout.plan(float(tier)).spec, seed=0))
                param_bytes = sum(v.nbytes for v in sub_model.values())
                blob = store.get(update["blob_id"])
                uploaded = decode_tensors(blob)
                assert {k: v.shape for k, v in uploaded.items()} == {k: v.shape for k, v in sub_model.items()}
                assert store.size(update["blob_id"]) == len(blob)
                assert sum(v.nbytes for v in uploaded.values()) == param_bytes
                assert param_bytes <= len(blob) <= 1.05 * param_bytes, (tier, len(blob), param_bytes)
        assert seen_tiers == set(TIERS)
    finally:
        registry.close()
