"""Edges + secure aggregation, in process: each edge group's round is a real secure round
(the device client and the server state machine, ``secagg/inprocess.py``), the edge turns
the unmasked sum into its group's partial (``edge/secure_group.py``), and the server folds the
edges' partials. The next global weights equal flat FedAvg / HeteroFL of the same updates
within the fixed-point tolerance; groups too small for a secure sum are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from fedcore.recipe import Recipe
from server_toolkit.assembly import aggregation_stack
from server_toolkit.cli import main
from server_toolkit.edge.aggregator import EdgeConfig
from server_toolkit.edge.fold import edge_instruction
from server_toolkit.edge.layer import EdgeFold
from server_toolkit.edge.partial import COVERAGE
from server_toolkit.edge.secure_group import SECURE_EDGE, SecureGroupSum
from server_toolkit.edge.sum_relay import SumRelay
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.aggregator import MethodAggregate, RoundInput
from server_toolkit.rounds.grid import Exchange
from server_toolkit.secagg.aggregate import UnmaskedSum, layout_for
from server_toolkit.secagg.inprocess import run_secure_round
from server_toolkit.secagg.mqtt_grid import SecAggMqttGrid, SecAggSettings

TOLERANCE = 1e-5  # fixed point: <= 0.5 / 2**20 per weighted value, plus the float32 mean on the wire
GROUPS = {"edge-1": ["d0", "d2", "d4"], "edge-2": ["d1", "d3", "d5"]}
SAMPLES = {f"d{i}": 10 + 3 * i for i in range(6)}


def _trained(instruction, rng) -> dict[str, np.ndarray]:
    return {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in instruction.weights.items()}


def _edge_answer(edge_id: str, name: str, options: dict, spec: dict, before, tiers: dict, rng,
                 flat: list) -> ClientUpdate:
    """``edge_id``'s answer to the server: a secure group round, its partial as sent up; the
    group's plain updates are appended to ``flat``."""
    relay = SumRelay(name, options)
    relay.forward(spec, Recipe(), 1)
    devices = [DeviceInfo(d, SAMPLES[d], tier=tiers.get(d)) for d in GROUPS[edge_id]]
    instructions = relay.configure_train(1, before, devices)
    trained = {i.device_id: (_trained(i, rng), SAMPLES[i.device_id], None) for i in instructions}
    flat += [ClientUpdate(i.device_id, SAMPLES[i.device_id], trained[i.device_id][0], {}, i)
             for i in instructions]
    layouts = {i.device_id: layout_for(relay.inner, before, i) for i in instructions}
    total = run_secure_round(1, layouts, trained).total
    first = instructions[0]
    unmasked = UnmaskedSum(total, layouts[first.device_id], first, before)
    stack = SecureGroupSum(EdgeFold(MethodAggregate(relay)))
    metrics_only = [ClientUpdate(i.device_id, SAMPLES[i.device_id], {}, {}, i) for i in instructions]
    info = RoundInput(exchange=Exchange(metrics_only, secure=unmasked))
    mean = stack.aggregate(1, before, metrics_only, info)
    edge = edge_instruction(relay.inner, before, edge_id)
    return ClientUpdate(edge.device_id, sum(SAMPLES[i.device_id] for i in instructions), mean,
                        {"edge_devices": len(instructions)}, edge,
                        others={COVERAGE: relay.partial.coverage(before)})


@pytest.mark.parametrize(("name", "options", "tiers"), [
    ("fedavg", {}, {}),
    ("heterofl", {"tier_ratios": {"a": 1.0, "b": 0.5}}, {d: "ab"[i % 3 == 0] for i, d in enumerate(SAMPLES)}),
], ids=["fedavg", "heterofl"])
def test_edges_with_secure_group_sums_give_the_flat_aggregate_of_the_same_updates(name, options, tiers):
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    method = (FedAvg(spec, Recipe()) if name == "fedavg" else HeteroFL(spec, Recipe(), **options))
    before = method.initial_weights(0)
    rng = np.random.default_rng(7)
    flat: list[ClientUpdate] = []
    answers = [_edge_answer(edge, name, options, spec, before, tiers, rng, flat) for edge in GROUPS]
    assert [a.device_id for a in answers] == ["edge-1", "edge-2"] and len(flat) == 6
    stack = aggregation_stack(method, secure=True)  # the server's stack under --secagg
    folded = stack.aggregate(1, before, answers, RoundInput(exchange=Exchange(answers)))
    plain = method.aggregate_train(1, before, flat)
    assert set(folded) == set(plain)
    moved = max(np.abs(plain[n].astype(np.float64) - before[n]).max() for n in plain)
    assert moved > 0.01  # the round did change the model: the comparison is not of two copies
    error = max(np.abs(folded[n].astype(np.float64) - plain[n]).max() for n in plain)
    assert error <= TOLERANCE, error


def test_a_secure_edge_refuses_a_group_smaller_than_three_devices_and_a_clustering_edge(tmp_path):
    settings = {"threshold": 0.5, "neighbours": None, "stage_timeout_s": 60.0}
    with pytest.raises(ValueError, match="at least 3 devices"):
        EdgeConfig("mqtt://127.0.0.1:1", "lab", "edge-1", tmp_path, method="fedavg", secagg=settings)
    with pytest.raises(ValueError, match="generic edge"):
        EdgeConfig("mqtt://127.0.0.1:1", "lab", "edge-1", tmp_path, min_devices=3, secagg=settings)
    EdgeConfig("mqtt://127.0.0.1:1", "lab", "edge-1", tmp_path, min_devices=3, method="fedavg",
               secagg=settings)


def test_simulate_refuses_secure_edge_groups_below_three_devices_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--rounds", "1", "--devices", "5", "--edges", "2", "--secagg"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "a secure group needs at least 3 devices" in result.output and "got 2" in result.output
    assert not any(tmp_path.rglob("runs"))


def test_a_secure_server_asks_only_secure_edges_and_never_mixes_edges_with_devices(tmp_path):
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    method = FedAvg(spec, Recipe())
    weights = method.initial_weights(0)
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = SecAggMqttGrid(None, registry, method, SecAggSettings())
    grid.devices = {"e1": DeviceInfo("e1", 9, profile={SECURE_EDGE: True}), "e2": DeviceInfo("e2", 9),
                    "d1": DeviceInfo("d1", 9)}
    edge = {d: edge_instruction(method, weights, d) for d in ("e1", "e2")}
    (device,) = method.configure_train(1, weights, [grid.devices["d1"]])
    kept, edges_only = grid._edges(1, [edge["e1"], edge["e2"]])
    assert [i.device_id for i in kept] == ["e1"] and edges_only  # e2 adds its group in the clear
    kept, edges_only = grid._edges(1, [edge["e1"], device])
    assert [i.device_id for i in kept] == ["d1"] and not edges_only  # a secure round of devices only
    kept, edges_only = grid._edges(1, [device])
    assert [i.device_id for i in kept] == ["d1"] and not edges_only
    registry.close()


def test_a_secure_round_whose_devices_all_dropped_before_masking_ends_without_updates(tmp_path, monkeypatch):
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    method = FedAvg(spec, Recipe())
    weights = method.initial_weights(0)
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = SecAggMqttGrid(None, registry, method, SecAggSettings())
    grid.devices = {d: DeviceInfo(d, 9) for d in ("d1", "d2", "d3")}
    for dev in grid.devices:
        registry.add_device(dev)
    monkeypatch.setattr(grid, "_say", lambda *args: None)
    monkeypatch.setattr(grid, "_send_task", lambda *args: None)
    monkeypatch.setattr(grid, "_run_stages", lambda *args: {})  # every device gone after the key exchange
    grid.serve(method, weights)
    exchange = grid.exchange(1, method.configure_train(1, weights, list(grid.devices.values())), 0.0, 3)
    assert exchange.updates == [] and exchange.secure is None
    registry.close()
