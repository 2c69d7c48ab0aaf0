"""Aggregation features together over a real mosquitto, with device and edge processes.

``simulate --edges 1`` with central DP (FedAvg on digits): the edge forwards its members'
updates, the server clips each and noises the round's sum once, and the epsilon in every row
is the accountant's for the noise, the sampling rate (one unit online, asked every round:
q = 1) and the rounds so far.
"""

from __future__ import annotations

import json
import math

import pytest

from fedcore.recipe import Recipe
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

RECIPE = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9)


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
