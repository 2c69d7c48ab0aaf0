"""Generic edge aggregators over a real mosquitto: the server's result equals the flat
aggregate of the updates the devices sent.

``Simulation`` with ``edges=2`` (real ``fedsdk-server edge --method M`` processes, real
device agents): the devices are dealt over the two edges whatever their tier, so with
HeteroFL each edge serves sub-models of three widths. After one round the server's
checkpoint is compared with ``M.aggregate_train`` over every device's update as its edge
received it (weights and the instruction it answered, read from the edges' registries and
blob stores): the flat aggregate of the same updates.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.assembly import assemble
from server_toolkit.rounds.checkpoint import load_checkpoint
from server_toolkit.sim.simulate import Simulation, SimulationConfig

from .harness import device_updates

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("method", "tiers"), [("fedavg", None), ("heterofl", ["1.0", "0.5", "0.25"])])
def test_generic_edges_give_the_flat_aggregate_over_mosquitto(mosquitto, tmp_path, method, tiers):
    recipe = Recipe(epochs=1, batch_size=16, lr=0.05).to_dict()
    config = SimulationConfig(method=method, devices=6 if tiers else 4, rounds=1, tiers=tiers, edges=2,
                              seed=0, recipe=recipe, device_runtime="torch", broker_url=mosquitto.url,
                              round_timeout_s=120)
    run_dir = tmp_path / "run"
    (row,) = Simulation(config, run_dir).run().rows
    assert row["accepted"] == 2 and row["rejected"] == 0, row  # one partial aggregate per edge

    updates = [u for edge in ("edge-1", "edge-2") for u in device_updates(run_dir / "edges" / edge, 1)]
    every = [f"dev{i:03d}" for i in range(config.devices)]
    assert sorted(u.device_id for u in updates) == every  # every device trained
    if tiers:  # each edge served every width
        for edge in ("edge-1", "edge-2"):
            ratios = {u.instruction.context["ratio"] for u in device_updates(run_dir / "edges" / edge, 1)}
            assert ratios == {1.0, 0.5, 0.25}
    setup = assemble(method, config.model, config.dataset, None, Recipe.from_dict(config.recipe),
                     {}, config.seed)
    start = setup.method.initial_weights(config.seed)
    flat = setup.method.aggregate_train(1, start, updates)
    _, served, _ = load_checkpoint(run_dir)
    assert set(served) == set(flat)
    for name in flat:
        np.testing.assert_allclose(served[name], flat[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(flat[n], start[n]) for n in flat)  # the round moved the model
