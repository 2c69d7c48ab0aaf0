"""Generic edge aggregators: partial sums folded at the parent equal the flat aggregate.

Synthetic updates (the instruction's weights plus seeded noise, random label counts) for
every averaging method; a hierarchy of two levels: the server has a direct device and two
edges, one of which serves a device and another edge. Each edge is the real ``SumRelay``
(it configures its own group with the method); the server is the round loop's ``configure``
/ ``aggregate``; the wire's float32 mean and coverage are what the parent folds.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.edge.fold import SUMS, aggregate, configure
from server_toolkit.edge.partial import COVERAGE, Partial
from server_toolkit.edge.sum_relay import SumRelay
from server_toolkit.methods import method_class
from server_toolkit.methods.base import MODEL, ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.methods.summands import Summand, refusal
from server_toolkit.models.zoo import model_spec, vgg_multi_exit

SMALL = model_spec("small_cnn", (1, 8, 8), 10)
EXITS = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 16))
WIDTHS = ("1.0", "0.75", "0.5", "0.25")
CASES = {  # method -> (model, options, tiers)
    "fedavg": (SMALL, {}, (None,)),
    "heterofl": (SMALL, {}, WIDTHS),
    "fedrolex": (SMALL, {}, WIDTHS),
    "depthfl": (EXITS, {}, ("1", "2", "3")),
    "hypemefed": (EXITS, {"hypernet": "none"}, ("1", "2", "3")),
}


@dataclasses.dataclass
class Edge:
    edge_id: str
    group: list  # DeviceInfo or Edge


def _fleet(tiers) -> list[DeviceInfo]:
    return [DeviceInfo(f"dev{i}", 20 + 7 * i, tiers[i % len(tiers)]) for i in range(9)]


def _hierarchy(devices: list[DeviceInfo]) -> list:
    """dev0 direct; edge-a: dev1-4 (mixed tiers); edge-b: dev5 and edge-c (dev6-8)."""
    inner = Edge("edge-c", devices[6:])
    return [devices[0], Edge("edge-a", devices[1:5]), Edge("edge-b", [devices[5], inner])]


def _trained(instruction: TrainInstruction, device: DeviceInfo) -> ClientUpdate:
    """What a device would send back: its weights moved by noise seeded by its id."""
    rng = np.random.default_rng(zlib.crc32(device.device_id.encode()))
    weights = {k: (v + rng.normal(0, 0.1, v.shape)).astype(v.dtype) for k, v in instruction.weights.items()}
    counts = [int(c) for c in rng.integers(0, 9, 10)]
    return ClientUpdate(device.device_id, device.num_samples, weights,
                        {"samples": device.num_samples, "label_counts": counts}, instruction)


def _info(item, method: str) -> DeviceInfo:
    if isinstance(item, DeviceInfo):
        return item
    samples = sum(_info(i, method).num_samples for i in item.group)
    profile = {"role": "edge", "aggregates": SUMS, "method": method}
    return DeviceInfo(item.edge_id, samples, None, profile=profile)


def _answer(item, instruction: TrainInstruction, rnd: int, name: str, options: dict) -> ClientUpdate:
    """A device's update, or an edge's partial aggregate as it travels (float32 mean and coverage)."""
    if isinstance(item, DeviceInfo):
        return _trained(instruction, item)
    relay = SumRelay(name, options)
    relay.forward(instruction.spec, instruction.recipe, rnd)
    infos = [_info(i, name) for i in item.group]
    asked = {i.device_id: i for i in configure(relay, rnd, instruction.weights, infos)}  # as its loop does
    updates = [_answer(i, asked[_info(i, name).device_id], rnd, name, options) for i in item.group]
    mean = aggregate(relay, rnd, instruction.weights, updates)
    samples = sum(u.num_samples for u in updates)
    return ClientUpdate(item.edge_id, samples, mean, {"samples": samples}, instruction,
                        {COVERAGE: relay.partial.coverage(instruction.weights)})


@pytest.mark.parametrize("name", sorted(CASES))
def test_edges_of_two_levels_give_the_flat_aggregate(name):
    spec, options, tiers = CASES[name]
    devices = _fleet(tiers)
    rnd = 3
    flat = method_class(name)(spec, Recipe(), **options)
    start = flat.initial_weights(0)
    asked = flat.configure_train(rnd, start, devices)
    expected = flat.aggregate_train(rnd, start, [_trained(i, d) for i, d in zip(asked, devices, strict=True)])

    server = method_class(name)(spec, Recipe(), **options)
    top = _hierarchy(devices)
    instructions = {i.device_id: i for i in configure(server, rnd, start, [_info(t, name) for t in top])}
    assert instructions["edge-a"].returns == (MODEL, COVERAGE)
    updates = [_answer(t, instructions[_info(t, name).device_id], rnd, name, options) for t in top]
    got = aggregate(server, rnd, start, updates)

    assert set(got) == set(expected)
    moved = 0
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=2e-6, err_msg=key)
        moved += not np.array_equal(expected[key], start[key])
    assert moved > len(expected) // 2  # the round changed the model: the comparison means something


def test_a_partial_adds_blocks_and_per_row_weights_and_leaves_uncovered_elements():
    start = {"w": np.zeros((3, 2), np.float32)}
    partial = Partial()
    partial.add(start, {"w": Summand(np.ones((2, 2), np.float32), (np.array([0, 2]),), 2.0)})
    partial.add(start, {"w": Summand(np.full((3, 2), 4.0, np.float32), (), np.array([[1.0], [0.0], [2.0]]))})
    out = partial.finish({"w": np.full((3, 2), 7.0, np.float32)})
    np.testing.assert_allclose(out["w"], [[2, 2], [7, 7], [2.5, 2.5]])  # row 0: (2*1+1*4)/3
    np.testing.assert_array_equal(partial.coverage(start)["w"], [[3, 3], [0, 0], [4, 4]])
    with pytest.raises(ValueError, match="do not fit"):
        partial.add(start, {"w": Summand(np.ones((1, 2)), (np.array([0, 1]),), 1.0)})


@pytest.mark.parametrize(("name", "options", "why"), [
    ("fedavgm", {}, "server step"),
    ("feddm", {}, "similarity tree"),
    ("hypemefed", {}, "hypernetworks"),
])
def test_methods_that_are_not_sums_are_refused_with_their_reason(name, options, why):
    spec = EXITS if name == "hypemefed" else SMALL
    method = method_class(name)(spec, Recipe(), **options)
    assert why in refusal(method)
    with pytest.raises(ValueError, match="cannot relay"):
        SumRelay(name, options).forward(method.global_spec, Recipe(), 1)


def test_the_server_leaves_out_edges_it_cannot_fold_and_still_asks_its_devices():
    devices = _fleet((None,))[:2]
    wrong = DeviceInfo("edge-x", 10, None, profile={"role": "edge", "aggregates": SUMS, "method": "heterofl"})
    fedavg = method_class("fedavg")(SMALL, Recipe())
    start = fedavg.initial_weights(0)
    asked = configure(fedavg, 1, start, [*devices, wrong])
    assert [i.device_id for i in asked] == ["dev0", "dev1"]  # another method: left out
    momentum = method_class("fedavgm")(SMALL, Recipe())
    edge = dataclasses.replace(wrong, profile={**wrong.profile, "method": "fedavgm"})
    assert [i.device_id for i in configure(momentum, 1, start, [*devices, edge])] == ["dev0", "dev1"]
