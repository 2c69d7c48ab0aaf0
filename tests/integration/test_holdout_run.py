"""Devices' held-back splits in real federations (``--holdout``, ``methods/holdout_accuracy.py``).

* ``fedsdk-server simulate --method heterofl --tiers 1.0,0.5,0.25 --holdout 0.1`` on digits:
  six real ``fedsdk run`` device processes over the embedded broker. Every row of
  metrics.jsonl has ``accuracy_holdout_tier_<t>`` for the three tiers; the held-back samples
  the devices report add up to what ``split_holdout`` holds back of their own data files, and
  each trained on the rest; the closing table shows a "holdout <t>" column per tier.
* The torch-free runtimes over mosquitto: devices on ``executorch-native`` (``pte/1``) and
  on ``onnxruntime`` (``ort-training/1``, from the ORT environment) report the held-back
  accuracy of the program they train, scored by that runtime.
* DepthFL devices over mosquitto score the mean softmax of their exits (``task.holdout_ensemble``).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fedcore.recipe import Recipe
from sdk_device.data.npz import load_npz
from sdk_device.holdout import split_holdout
from server_toolkit.cli import main
from server_toolkit.cli import options as cli_options
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import Simulation, SimulationConfig

from ..ort_env import ort_python

pytestmark = pytest.mark.integration

TIERS = ("1.0", "0.5", "0.25")


def _updates(run_dir, rounds: int) -> list[list[dict]]:
    registry = FleetRegistry(run_dir / "registry.sqlite")
    try:
        return [registry.updates(rnd) for rnd in range(1, rounds + 1)]
    finally:
        registry.close()


def test_simulate_with_holdout_writes_each_tiers_held_back_accuracy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the closing table's headers unabridged: the CLI's console was made at import, so COLUMNS
    # set now would not reach it (it did when this file ran alone, not in the suite)
    monkeypatch.setattr(cli_options.console, "_width", 240)
    args = ["simulate", "--method", "heterofl", "--tiers", ",".join(TIERS), "--devices", "6", "--rounds", "2",
            "--holdout", "0.1", "--local-epochs", "1", "--round-timeout", "240", "--run-dir", "run"]
    result = CliRunner().invoke(main, args, prog_name="fedsdk-server", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((run / "config.json").read_text())["holdout"] == 0.1
    held = {}
    for dev_dir in sorted((run / "devices").iterdir()):
        _, y = load_npz(dev_dir / "data.npz")
        held[dev_dir.name] = (len(y), len(split_holdout(y, 0.1)[1]))
    assert len(held) == 6 and all(h > 0 for _, h in held.values())
    for row in rows:
        assert row["accepted"] == 6, row
        for tier in TIERS:
            assert 0.0 <= row[f"accuracy_holdout_tier_{tier}"] <= 1.0, row
        assert row["holdout_samples"] == sum(h for _, h in held.values()), row
    for updates in _updates(run, len(rows)):
        for u in updates:
            n, h = held[u["device_id"]]
            assert u["metrics"]["holdout_samples"] == h and u["metrics"]["samples"] == n - h, u
            assert 0.0 <= u["metrics"]["holdout_accuracy"] <= 1.0
    for tier in TIERS:
        assert f"holdout {tier}" in result.output and f"tier {tier}" in result.output


@pytest.mark.parametrize("runtime", ["executorch-native", "onnxruntime"])
def test_torch_free_runtimes_score_their_own_program_on_the_held_back_split(runtime, mosquitto, tmp_path):
    program = {"executorch-native": "pte/1", "onnxruntime": "ort-training/1"}[runtime]
    config = SimulationConfig(method="fedavg", devices=2, rounds=2, partition="iid", seed=0, holdout=0.2,
                              recipe=Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict(),
                              round_timeout_s=240.0, broker_url=mosquitto.url, fleet="lab",
                              program_formats=[program, "torchspec/1"], device_runtime=runtime,
                              device_python=ort_python() if runtime == "onnxruntime" else None)
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["accepted"] for r in rows] == [2, 2], rows
    for row in rows:
        assert 0.0 <= row["accuracy_holdout_tier_default"] <= 1.0 and row["holdout_samples"] > 0, row
    updates = [u for rnd in _updates(run_dir, 2) for u in rnd]
    assert {u["metrics"]["runtime"] for u in updates} == {runtime}
    assert all(u["metrics"]["holdout_samples"] > 0 for u in updates)
    # round 2's devices received the aggregate of round 1: it scores above round 1's random model
    assert rows[1]["accuracy_holdout"] > rows[0]["accuracy_holdout"], rows


def test_an_edge_passes_its_groups_held_back_accuracy_up(mosquitto, tmp_path):
    recipe = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict()
    config = SimulationConfig(method="fedavg", devices=3, rounds=2, edges=1, partition="iid", seed=0,
                              holdout=0.2, recipe=recipe, round_timeout_s=240.0, broker_url=mosquitto.url,
                              fleet="lab", device_runtime="torch")
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    held = {}
    for dev_dir in sorted((run_dir / "devices").iterdir()):
        _, y = load_npz(dev_dir / "data.npz")
        held[dev_dir.name] = len(split_holdout(y, 0.2)[1])
    assert len(held) == 3
    group = FleetRegistry(run_dir / "edges" / "edge-1" / "registry.sqlite")
    try:  # the edge's own rounds over its group: each device reported its split
        group_rounds = [updates for rnd in range(1, 6) if (updates := group.updates(rnd))]
    finally:
        group.close()
    means = []
    for updates in group_rounds:
        assert {u["device_id"]: u["metrics"]["holdout_samples"] for u in updates} == held
        means.append(sum(u["metrics"]["holdout_accuracy"] * held[u["device_id"]] for u in updates)
                     / sum(held.values()))
    for row, updates in zip(rows, _updates(run_dir, 2), strict=True):
        (edge,) = updates
        assert edge["device_id"] == "edge-1" and edge["metrics"]["holdout_samples"] == sum(held.values())
        assert edge["metrics"]["holdout_accuracy"] == pytest.approx(row["accuracy_holdout"])
        assert row["accuracy_holdout_tier_default"] == pytest.approx(row["accuracy_holdout"])
        assert row["holdout_samples"] == sum(held.values())
        assert any(edge["metrics"]["holdout_accuracy"] == pytest.approx(m) for m in means)


def _round_one(server_dir) -> tuple[list[dict], dict]:
    """Round 1's updates in ``server_dir``'s registry, and each device's task as it was sent."""
    from sdk_device.transport.blob_store import BlobStore
    from server_toolkit.rounds.task_records import instruction_from_record

    registry, store = FleetRegistry(server_dir / "registry.sqlite"), BlobStore(server_dir / "blobs")
    try:
        updates = registry.updates(1)
        return updates, {u["device_id"]: instruction_from_record(registry.task(u["task_id"]), store)
                         for u in updates}
    finally:
        registry.close()


@pytest.mark.parametrize("edges", [0, 1])
def test_depthfl_devices_over_mqtt_score_the_exits_ensemble(edges, mosquitto, tmp_path):
    """DepthFL (ensemble on) with ``--holdout 0.2``, two real device processes of tiers 2 and 1
    over mosquitto (directly, or behind one edge aggregator), one round: each task asked for
    the ensemble (``task.holdout_ensemble``, kept in its task record), and each device's
    ``holdout_accuracy`` is the server's ``ensemble_accuracy`` of the weights its task sent,
    on the split it held back, and its ``holdout_loss`` the mean NLL of that mean softmax."""
    import torch

    from fedcore.torch_model import build_model, load_numpy
    from server_toolkit.models.exit_eval import ensemble_accuracy

    recipe = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict()
    config = SimulationConfig(method="depthfl", model="lenet5_multi_exit", tiers=["2", "1"], devices=2,
                              rounds=1, partition="iid", seed=0, holdout=0.2, recipe=recipe,
                              round_timeout_s=240.0, broker_url=mosquitto.url, fleet="lab",
                              device_runtime="torch", edges=edges)
    run_dir = tmp_path / "run"
    (row,) = Simulation(config, run_dir).run().rows
    server = run_dir / "edges" / "edge-1" if edges else run_dir  # with an edge: its group's tasks
    updates, sent_tasks = _round_one(server)
    assert len(updates) == 2 and "accuracy_holdout" in row  # an edge counts as one device of its tier
    assert edges or {"accuracy_holdout_tier_2", "accuracy_holdout_tier_1"} <= set(row)
    for u in updates:
        x, y = load_npz(run_dir / "devices" / u["device_id"] / "data.npz")
        held = split_holdout(y, 0.2)[1]
        sent = sent_tasks[u["device_id"]]
        assert sent.holdout_ensemble and sent.holdout == 0.2
        want = ensemble_accuracy(sent.spec, sent.weights, x[held], y[held])
        assert u["metrics"]["holdout_accuracy"] == pytest.approx(want, abs=1e-9), u["device_id"]
        # the loss tells the ensemble from the final output even where their accuracies agree
        model = build_model(sent.spec)
        load_numpy(model, sent.weights)
        with torch.no_grad():
            model.eval()
            probs = torch.stack([torch.softmax(o, 1) for o in model(torch.from_numpy(x[held]))]).mean(0)
        nll = -float(torch.log(probs[torch.arange(len(held)), torch.from_numpy(y[held])]).mean())
        assert u["metrics"]["holdout_loss"] == pytest.approx(nll, rel=1e-5), u["device_id"]


def test_heterofl_nested_devices_over_mqtt_score_the_nested_ensemble(mosquitto, tmp_path):
    """HeteroFL ``deploy="nested"`` with ``--holdout 0.2``, three real device processes of tiers
    1.0 / 0.5 / 0.25 over mosquitto, one round: the wider devices' tasks carry the narrower
    windows as extra untrained models (``member_k``, torchspec/1) named in
    ``task.holdout_members`` (kept in the task record), and each device's ``holdout_accuracy``
    is the server's ``members_accuracy`` of its window and those, on the split it held back."""
    from server_toolkit.methods.tier_accuracy import members_accuracy

    recipe = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict()
    config = SimulationConfig(method="heterofl", tiers=list(TIERS), devices=3, rounds=1, partition="iid",
                              seed=0, holdout=0.2, recipe=recipe, round_timeout_s=240.0,
                              broker_url=mosquitto.url, fleet="lab", device_runtime="torch",
                              method_options={"deploy": "nested"})
    run_dir = tmp_path / "run"
    (row,) = Simulation(config, run_dir).run().rows
    updates, sent_tasks = _round_one(run_dir)
    assert len(updates) == 3 and {f"accuracy_holdout_tier_{t}" for t in TIERS} <= set(row)
    counts = []
    for u in updates:
        x, y = load_npz(run_dir / "devices" / u["device_id"] / "data.npz")
        held = split_holdout(y, 0.2)[1]
        sent = sent_tasks[u["device_id"]]
        counts.append(len(sent.holdout_members))
        assert set(sent.holdout_members) <= set(sent.models) and sent.returns == ("model",)
        windows = [(sent.spec, sent.weights)] + [(sent.models[n].spec, sent.models[n].weights)
                                                 for n in sent.holdout_members]
        want = members_accuracy(windows, x[held], y[held])
        assert u["metrics"]["holdout_accuracy"] == pytest.approx(want, abs=1e-9), u["device_id"]
    assert sorted(counts) == [0, 1, 2]  # the 1.0 device scores three windows, the 0.5 two, the 0.25 one
