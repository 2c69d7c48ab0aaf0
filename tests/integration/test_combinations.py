"""Aggregation features together over a real mosquitto, with device and edge processes.

``simulate --edges 1`` with central DP (FedAvg on digits): the edge forwards its members'
updates, the server clips each and noises the round's sum once, and the epsilon in every row
is the accountant's for the noise, the sampling rate (one unit online, asked every round:
q = 1) and the rounds so far.

The four-way stack, ``simulate --edges 2 --secagg --dp-clip C --mode async``: two real
``fedsdk-server edge --secagg`` processes of three device processes each; every device clips its
own delta and masks it with weight 1, each edge unmasks only its group's sum, the async server
folds the edges' sums into each version with their staleness and noises the version once; the
epsilon in every row is the accountant's (q = 1, one release per version) and the run ends above
the accuracy written here.
"""

from __future__ import annotations

import json
import math

import pytest

from fedcore.recipe import Recipe
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

RECIPE = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9)
FOUR_WAY_ACCURACY = 0.3  # digits, 6 devices, 4 versions of 2 epochs, C = 1, z = 0.05 (0.50 measured)


def test_central_dp_behind_an_edge_clips_each_member_and_reports_the_accountants_epsilon(mosquitto, tmp_path):
    privacy = {"clip": 1.0, "noise_multiplier": 0.5, "delta": 1e-5}
    config = SimulationConfig(method="fedavg", devices=4, rounds=2, edges=1, partition="iid",
                              recipe=RECIPE.to_dict(), round_timeout_s=60.0, broker_url=mosquitto.url,
                              fleet="lab", privacy=privacy)
    Simulation(config, tmp_path / "run").run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["accepted"] for r in rows] == [4, 4]  # every member's own update, forwarded by the edge
    assert all(r["dp_clip"] == 1.0 and math.isfinite(r["loss"]) for r in rows)
    for i, row in enumerate(rows, start=1):
        assert row["dp_epsilon"] == pytest.approx(epsilon("central", 0.5, [1.0] * i, 1e-5), rel=1e-12)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["dp_rounds"] == 2


def test_edges_secagg_central_dp_and_async_together_train_digits_at_the_accountants_epsilon(mosquitto,
                                                                                         tmp_path):
    privacy = {"clip": 1.0, "noise_multiplier": 0.05, "delta": 1e-5}
    secagg = {"threshold": 0.5, "neighbours": None, "stage_timeout_s": 30.0}
    config = SimulationConfig(method="fedavg", devices=6, rounds=4, edges=2, partition="iid", seed=0,
                              recipe=Recipe(epochs=2, batch_size=16, lr=0.05, momentum=0.9).to_dict(),
                              round_timeout_s=60.0, broker_url=mosquitto.url, fleet="lab", privacy=privacy,
                              secagg=secagg, mode="async", buffer=6, max_staleness=4)
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["version"] for r in rows] == [1, 2, 3, 4], rows
    assert all(r["folded"] >= 6 and r["edge_results"] >= 2 for r in rows), rows  # edges' sums, 3 devices each
    for i, row in enumerate(rows, start=1):  # one release per version, no subsampling
        assert row["dp_epsilon"] == pytest.approx(epsilon("central", 0.05, [1.0] * i, 1e-5), rel=1e-12)
        assert row["dp_clip"] == 1.0
    assert rows[-1]["accuracy"] >= FOUR_WAY_ACCURACY, rows
    for edge in ("edge-1", "edge-2"):
        registry = FleetRegistry(run_dir / "edges" / edge / "registry.sqlite")
        try:  # secure group rounds: no device update was ever stored at an edge
            done = [r for r in range(1, 12) if registry.round_info(r) is not None]
            assert done and all(registry.updates(r) == [] for r in done)
        finally:
            registry.close()
        assert "secagg reveal from 3/3 devices" in (run_dir / "edges" / edge / "edge.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    spent = summary["privacy"]
    assert spent["dp_rounds"] == 4 and "secure aggregation" in spent["dp_assumption"]
