"""Every method reports each tier's deployable accuracy (``accuracy_tier_<tier>``,
``methods/tier_accuracy.py``): one round of ``simulate``'s in-process path on a slice of digits,
with the tiers and options of the method's own example."""

from __future__ import annotations

import json
import shlex

import pytest

from server_toolkit.methods import methods
from server_toolkit.methods.tier_accuracy import tier_key
from server_toolkit.sim.simulate import Simulation, SimulationConfig

TINY_RECIPE = {"epochs": 1, "batch_size": 16, "optimizer": "sgd", "lr": 0.05, "max_steps": 2}


def example_config(name: str) -> SimulationConfig:
    """The method's example arguments (model, tiers, partition, options) on 120 digits, one round."""
    args = shlex.split(methods()[name].example)
    given = dict(zip(args[::2], args[1::2], strict=True))
    tiers = given["--tiers"].split(",")[:2] if "--tiers" in given else None
    options = dict(o.split("=", 1) for k, o in zip(args[::2], args[1::2], strict=True)
                   if k == "--method-option")
    options = {k: json.loads(v) if v[:1] in "[{0123456789" else v for k, v in options.items()}
    return SimulationConfig(method=name, model=given.get("--model", "small_cnn"), devices=len(tiers or [1, 1]),
                            rounds=1, grid="inprocess", tiers=tiers, method_options=options,
                            partition=given.get("--partition", "iid"), min_size=1, train_samples=240,
                            test_samples=60, recipe=TINY_RECIPE)


@pytest.mark.parametrize("name", sorted(methods()))
def test_every_method_reports_the_deployable_accuracy_of_each_of_its_tiers(name, tmp_path):
    config = example_config(name)
    report = Simulation(config, tmp_path / "run").run()
    row = report.rows[-1]
    tiers = sorted(set(config.tiers or [None]), key=str)
    found = {key: row.get(key) for key in map(tier_key, tiers)}
    assert all(isinstance(v, float) and 0 <= v <= 1 for v in found.values()), found
    assert sorted(k for k in row if k.startswith("accuracy_tier_")) == sorted(found)
