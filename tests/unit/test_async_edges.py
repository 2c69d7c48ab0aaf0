"""Async mode behind generic edges (rounds/staleness.py, edge/): a buffer holding an edge's
partial aggregate folds to the same weights as the flat buffer of its members' updates.

Synthetic updates (the instruction's weights plus seeded noise). The edge is the real
``SumRelay``: it configures its group from the (stale) version it was sent, and its answer
travels as on the wire (float32 mean, float32 coverage). The buffer also holds a fresh update
of a device talking to the server directly, so partials and summands meet in one fold.
Also: how an edge's result counts, an edge partial recovered after a restart, the norm bound
on partials, and a bundle edge's answer in the buffer.
"""

from __future__ import annotations

import types
import zlib

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import encode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.assembly import aggregation_stack
from server_toolkit.edge.bundle import bundle_instruction
from server_toolkit.edge.fold import SUMS, configure, is_partial
from server_toolkit.edge.layer import edge_stack
from server_toolkit.edge.partial import COVERAGE
from server_toolkit.edge.sum_relay import SumRelay
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.aggregator import RoundInput
from server_toolkit.rounds.async_grid import Arrival
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.loop import LoopConfig
from server_toolkit.rounds.mqtt_async import AsyncMqttGrid
from server_toolkit.rounds.norm_bound import bound_updates
from server_toolkit.rounds.staleness import BufferedUpdate, staleness_stats
from server_toolkit.rounds.staleness import fold_buffer as fold_with
from server_toolkit.rounds.task_records import ARRAYS_KEY, task_record

from .test_async_loop import ScriptedGrid

SPEC = model_spec("small_cnn", (1, 8, 8), 10)
CASES = {"fedavg": (None,), "heterofl": ("1.0", "0.5", "0.25")}
EDGE = {"role": "edge", "aggregates": SUMS}


def fold_buffer(method, version, now, buffer):
    """The buffer folded as the async loop's stack folds it: through the edge layer."""
    stack = edge_stack(method, None)
    return fold_with(lambda v, zeros, scaled: stack.aggregate(v, zeros, scaled, RoundInput()), version, now,
                     buffer)


def carried(update):
    return edge_stack(method_class("fedavg")(SPEC, Recipe()), None).carried(update)


def _trained(instruction: TrainInstruction) -> ClientUpdate:
    """A device's answer: the weights it was sent moved by noise seeded by its id."""
    rng = np.random.default_rng(zlib.crc32(instruction.device_id.encode()))
    weights = {k: (v + rng.normal(0, 0.1, v.shape)).astype(v.dtype) for k, v in instruction.weights.items()}
    samples = 20 + int(instruction.device_id[-1]) * 7
    return ClientUpdate(instruction.device_id, samples, weights, {"samples": samples}, instruction)


def _edge_answer(name: str, instruction: TrainInstruction, rnd: int, members: list[DeviceInfo]):
    """The edge's partial as the server receives it, and its members' updates."""
    relay = SumRelay(name)
    relay.forward(instruction.spec, instruction.recipe, rnd)
    updates = [_trained(i) for i in relay.configure_train(1, instruction.weights, members)]
    mean = relay.aggregate_train(1, instruction.weights, updates)
    samples = sum(u.num_samples for u in updates)
    metrics = {"samples": samples, "edge_devices": len(updates)}
    partial = ClientUpdate(instruction.device_id, samples, mean, metrics, instruction,
                           {COVERAGE: relay.partial.coverage(instruction.weights)})
    return partial, updates


def _moved(weights: dict, rng) -> dict:
    return {k: (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype) for k, v in weights.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stale_edge_partial_folds_like_its_members_updates_with_the_same_base(name):
    tiers = CASES[name]
    method = method_class(name)(SPEC, Recipe())
    rng = np.random.default_rng(4)
    base = _moved(method.initial_weights(0), rng)  # version 3
    now = _moved(base, rng)  # version 5
    members = [DeviceInfo(f"dev{i}", 1, tiers[i % len(tiers)]) for i in range(1, 4)]
    edge = DeviceInfo("edge-1", 1, None, profile={**EDGE, "method": name})
    (edge_task,) = configure(method, 3 + 1, base, [edge])  # sent from version 3
    partial, updates = _edge_answer(name, edge_task, 4, members)
    (direct_task,) = method.configure_train(6, now, [DeviceInfo("dev0", 1, tiers[0])])
    direct = BufferedUpdate(_trained(direct_task), base=5, staleness=0)

    with_edge = fold_buffer(method, 6, now, [BufferedUpdate(partial, base=3, staleness=2), direct])
    flat = fold_buffer(method, 6, now, [BufferedUpdate(u, base=3, staleness=2) for u in updates] + [direct])
    moved = 0
    for key in flat:
        np.testing.assert_allclose(with_edge[key], flat[key], rtol=1e-5, atol=2e-6, err_msg=key)
        moved += not np.allclose(flat[key], now[key])
    assert moved > len(flat) // 2  # the fold moved the model: the comparison means something
    # only the staleness weight differs from a fresh edge: the stale one moves the model less
    fresh = fold_buffer(method, 6, now, [BufferedUpdate(partial, base=5, staleness=0), direct])
    assert not all(np.allclose(fresh[k], with_edge[k]) for k in flat)


def test_an_edge_partial_counts_as_the_device_updates_it_carries():
    method = method_class("fedavg")(SPEC, Recipe())
    weights = method.initial_weights(0)
    edge = DeviceInfo("edge-1", 1, None, profile={**EDGE, "method": "fedavg"})
    (task,) = configure(method, 1, weights, [edge])
    partial, updates = _edge_answer("fedavg", task, 1, [DeviceInfo(f"dev{i}", 1) for i in range(1, 4)])
    assert carried(partial) == 3 and carried(updates[0]) == 1
    forged = ClientUpdate("edge-1", 1, partial.weights, {"edge_devices": "many"}, task, partial.others)
    assert carried(forged) == 1  # a bad count from the network counts once
    stats = staleness_stats([BufferedUpdate(partial, 0, 2), BufferedUpdate(updates[0], 3, 0)], carried)
    assert stats == {"staleness_mean": 1.5, "staleness_max": 2}  # (3 x 2 + 1 x 0) / 4


def test_an_edge_partial_accepted_before_a_restart_is_recovered_and_folds_alike(tmp_path):
    """As the MQTT grid persists it (task record, result blobs, registry row) and reads it back."""
    method = method_class("heterofl")(SPEC, Recipe())
    base = method.initial_weights(0)
    edge = DeviceInfo("edge-1", 1, None, profile={**EDGE, "method": "heterofl"})
    (task,) = configure(method, 4, base, [edge])  # made from version 3
    members = [DeviceInfo(f"dev{i}", 1, tier) for i, tier in enumerate(("1.0", "0.5"), start=1)]
    partial, _ = _edge_answer("heterofl", task, 4, members)
    store, registry = BlobStore(tmp_path / "blobs"), FleetRegistry(tmp_path / "registry.sqlite")
    blobs = {name: store.put(encode_tensors(model.weights)) for name, model in task.all_models().items()}
    for version in range(4):  # as the grid opens them: registry round = version + 1
        registry.open_round(version + 1, [], "")
    registry.add_task("t1", 4, "edge-1", task_record(task, blobs, {name: [] for name in blobs}))
    coverage = store.put(encode_tensors(partial.others[COVERAGE]))
    registry.add_update(4, "edge-1", "t1", store.put(encode_tensors(partial.weights)), partial.num_samples,
                        {**partial.metrics, ARRAYS_KEY: {COVERAGE: coverage}})
    grid = AsyncMqttGrid(types.SimpleNamespace(store=store, announce_epoch=lambda epoch: None), registry)
    (arrival,) = grid.recovered(consumed=0)
    registry.close()
    assert arrival.base == 3 and is_partial(arrival.update) and carried(arrival.update) == 2
    now = {k: v + 0.01 for k, v in base.items()}  # version 5
    folded = fold_buffer(method, 6, now, [BufferedUpdate(arrival.update, 3, 2)])
    want = fold_buffer(method, 6, now, [BufferedUpdate(partial, 3, 2)])
    for key in want:
        np.testing.assert_array_equal(folded[key], want[key], err_msg=key)
    assert any(not np.allclose(folded[k], now[k]) for k in want)


def test_the_norm_bound_clips_an_edge_delta_but_never_its_coverage():
    method = method_class("fedavg")(SPEC, Recipe())
    weights = method.initial_weights(0)
    edge = DeviceInfo("edge-1", 1, None, profile={**EDGE, "method": "fedavg"})
    (task,) = configure(method, 1, weights, [edge])
    small, _ = _edge_answer("fedavg", task, 1, [DeviceInfo("dev1", 1), DeviceInfo("dev2", 1)])
    big, _ = _edge_answer("fedavg", task, 1, [DeviceInfo("dev3", 1)])
    crowd = {k: v * 50 for k, v in big.others[COVERAGE].items()}  # 50x the samples: no reason to clip
    sent = task.weights
    forged = {k: (sent[k] + 1e3 * (v - sent[k])).astype(v.dtype) for k, v in big.weights.items()}
    big = ClientUpdate("edge-2", big.num_samples, forged, big.metrics, task, {COVERAGE: crowd})
    third, _ = _edge_answer("fedavg", task, 1, [DeviceInfo("dev4", 1)])
    (_, clipped_big, _), count = bound_updates(1, [small, big, third], 10.0)
    assert count == 1 and not np.allclose(clipped_big.weights["layers.0.weight"], forged["layers.0.weight"])
    for name, value in crowd.items():
        np.testing.assert_array_equal(clipped_big.others[COVERAGE][name], value)


def test_a_bundle_edges_answer_joins_the_buffer_as_its_members_updates_of_its_base(tmp_path):
    method = method_class("fedavg")(SPEC, Recipe())
    loop = AsyncLoop(method, ScriptedGrid({}), LoopConfig(rounds=5, norm_bound=None), AsyncConfig(3, 4),
                     run_dir=tmp_path,
                     aggregator=aggregation_stack(method, None, async_settings=AsyncConfig(3, 4)))
    loop.start()
    members = method.configure_train(1, loop.global_weights, [DeviceInfo("dev1", 30), DeviceInfo("dev2", 10)])
    task = bundle_instruction(method, "edge-1", members)  # made from version 0
    trained = [_trained(i) for i in members]
    per = {f"m{k}": {"samples": u.num_samples} for k, u in enumerate(trained)}
    answer = ClientUpdate("edge-1", sum(u.num_samples for u in trained), {},
                          {"samples": sum(u.num_samples for u in trained), "members": per}, task,
                          {f"m{k}": u.weights for k, u in enumerate(trained)})
    loop.completed_round = 2
    loop._take(Arrival(answer, base=0))
    taken = [(b.update.device_id, b.base, b.staleness) for b in loop.buffer]
    assert taken == [("dev1", 0, 2), ("dev2", 0, 2)]
    assert loop.consumed == 1 and loop._since["accepted"] == 2  # one registry entry, two device updates
    now = loop.global_weights
    got = fold_buffer(method, 3, now, loop.buffer)
    want = fold_buffer(method, 3, now, [BufferedUpdate(u, 0, 2) for u in trained])
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert any(not np.allclose(got[k], now[k]) for k in want)


def test_an_edge_the_method_cannot_use_gets_no_task_and_one_error(tmp_path, caplog):
    class WithEdge(ScriptedGrid):
        def online(self) -> list[DeviceInfo]:
            wrong = {**EDGE, "method": "heterofl"}  # the server runs fedavg
            return [*super().online(), DeviceInfo("edge-x", 10, None, profile=wrong)]

        def idle(self) -> list[DeviceInfo]:
            return [d for d in self.online() if d.device_id not in self.tasks]

    grid = WithEdge({"a": 1, "b": 2})
    method = method_class("fedavg")(SPEC, Recipe())
    loop = AsyncLoop(method, grid, LoopConfig(rounds=4, norm_bound=None), AsyncConfig(2, 4), run_dir=tmp_path,
                     aggregator=aggregation_stack(method, None, async_settings=AsyncConfig(2, 4)))
    loop.start()
    with caplog.at_level("ERROR"):
        rows = loop.run()
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert all(arrival.update.device_id != "edge-x" for arrival in grid.accepted)
    assert [r.getMessage() for r in caplog.records if "edge-x" in r.getMessage()] == [
        "round 1: edge edge-x left out: it runs method 'heterofl', the server 'fedavg'"]
