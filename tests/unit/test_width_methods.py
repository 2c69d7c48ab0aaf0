"""The width methods: offset rules, coverage balance over rounds, tiers, FedDM's slots,
restart determinism and similarity-tree cooperation."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.tiers import resolve_tier, with_tier_overrides
from server_toolkit.methods.width.coverage import coverage_counts
from server_toolkit.methods.width.feddm import FedDM
from server_toolkit.methods.width.similarity_tree import (
    build_tree,
    client_distance,
    depth_levels,
    label_distributions,
    pairwise_symmetric_kl,
    subtree_labels,
)
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import label_histogram, partition
from server_toolkit.submodels.offsets import four_corner_offsets, rolling_offsets
from server_toolkit.submodels.width import width_layout

SPEC = model_spec("small_cnn", (1, 8, 8), 10)
TIERS = ("1.0", "0.75", "0.5", "0.25")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _devices(n: int) -> list[DeviceInfo]:
    return [DeviceInfo(f"dev{i:03d}", 50 + i, TIERS[i % 4]) for i in range(n)]


def _play(method, devices, rounds: int) -> dict[str, np.ndarray]:
    """Coverage (client-rounds) of every weight's (out, in) grid by the sub-model clients."""
    weights = method.initial_weights(0)
    names = [f"{unit}.weight" for unit in method.layout.units]
    counts = {n: np.zeros(weights[n].shape[:2]) for n in names}
    for rnd in range(1, rounds + 1):
        instructions = method.configure_train(rnd, weights, devices)
        for ins in instructions:
            if ins.context["ratio"] < 1:
                for n in names:
                    counts[n] += coverage_counts(counts[n].shape, [(method.index_map(ins.context)[n][:2], 1)])
        weights = method.aggregate_train(rnd, weights, [ClientUpdate(i.device_id, 1, i.weights, {}, i)
                                                        for i in instructions])
    return counts


def test_heterofl_always_takes_the_top_left_block():
    method = method_class("heterofl")(SPEC, Recipe())
    for rnd in (1, 7):
        (ins,) = method.configure_train(rnd, method.initial_weights(0), [DeviceInfo("a", 1, "0.5")])
        rows, cols = method.index_map(ins.context)["layers.3.weight"]
        np.testing.assert_array_equal(rows, np.arange(16))
        np.testing.assert_array_equal(cols, np.arange(8))


def test_fedrolex_rolls_one_channel_per_round_and_wraps():
    layout = width_layout(SPEC)
    first = layout.hidden_spaces[0]  # 16 channels
    assert [rolling_offsets(layout, 0.5, t)[first] for t in (1, 2, 16, 17)] == [0, 1, 15, 0]
    method = method_class("fedrolex")(SPEC, Recipe())
    (ins,) = method.configure_train(12, method.initial_weights(0), [DeviceInfo("a", 1, "0.5")])
    rows = method.index_map(ins.context)["layers.0.weight"][0]
    np.testing.assert_array_equal(rows, [0, 1, 2, 11, 12, 13, 14, 15])


def test_four_corner_visits_all_four_corners_of_a_layer():
    layout = width_layout(SPEC)
    rows_space, cols_space = layout.hidden_spaces[1], layout.hidden_spaces[0]  # layers.3: 32 x 16
    starts = [four_corner_offsets(layout, 0.75, t) for t in range(1, 5)]
    corners = {(start[rows_space], start[cols_space]) for start in starts}
    assert corners == {(0, 0), (0, 4), (8, 0), (8, 4)}


def test_feddm_covers_every_layer_more_evenly_than_the_other_rules():
    devices = _devices(12)
    rules = {"heterofl": ("heterofl", {}), "fedrolex": ("fedrolex", {}),
             "four_corner": ("feddm", {"tree": False, "rule": "four_corner"}),
             "feddm": ("feddm", {"tree": False})}
    cv = {}
    for rule, (name, options) in rules.items():
        counts = _play(method_class(name)(SPEC, Recipe(), **options), devices, rounds=100)
        cv[rule] = {layer: c.std() / c.mean() for layer, c in counts.items()}
    assert all(value < 0.05 for value in cv["feddm"].values()), cv
    for layer in ("layers.3.weight", "layers.7.weight"):  # both axes cut: the 2-D grid
        for other in ("heterofl", "fedrolex", "four_corner"):
            assert cv["feddm"][layer] < cv[other][layer] / 2, (layer, other, cv)


def test_feddm_spreads_the_devices_of_a_tier_within_a_round():
    method = FedDM(SPEC, Recipe(), tree=False)
    devices = [DeviceInfo(f"d{i}", 10, "0.25") for i in range(4)]
    weights = method.initial_weights(0)
    for rnd in (1, 2):
        instructions = method.configure_train(rnd, weights, devices)
        weights = method.aggregate_train(rnd, weights, [ClientUpdate(i.device_id, 1, i.weights, {}, i)
                                                        for i in instructions])
    # from round 2 on the four 0.25-devices hold slots 0..3: together they tile every space
    windows = [(method.index_map(i.context)["layers.0.weight"][:1], 1) for i in instructions]
    np.testing.assert_array_equal(coverage_counts((16,), windows), np.ones(16))


def test_tiers_come_from_the_map_the_fleet_or_the_profile():
    method = method_class("heterofl")(SPEC, Recipe(), tier_ratios={"phone": 0.75})
    fleet = [DeviceInfo("a", 1, "0.5"), DeviceInfo("b", 1, "0.25"),
             DeviceInfo("c", 1, resolve_tier(None, {"tier": "0.25"})), DeviceInfo("d", 1, None)]
    a, b, c, d = with_tier_overrides(fleet, {"b": "phone"})  # the run's tier_map, applied by the round loop
    assert method.ratio_of(a) == 0.5
    assert method.ratio_of(b) == 0.75  # the map wins, and names a tier of tier_ratios
    assert method.ratio_of(DeviceInfo("b", 1, "phone")) == 0.75
    assert method.ratio_of(c) == 0.25  # from the profile
    assert method.ratio_of(d) == 1.0
    unresolved = DeviceInfo("c", 1, None, profile={"tier": "0.25"})
    assert method.ratio_of(unresolved) == 1.0  # methods read .tier only
    with pytest.raises(ValueError, match="neither a ratio"):
        method.ratio_of(DeviceInfo("e", 1, "watch"))
    with pytest.raises(ValueError, match="not in"):
        method.ratio_of(DeviceInfo("f", 1, "1.5"))
    with pytest.raises(TypeError):
        method_class("fedrolex")(SPEC, Recipe(), unknown_option=1)
    with pytest.raises(TypeError, match="tier_map"):  # no longer a method option
        method_class("heterofl")(SPEC, Recipe(), tier_map={"b": "phone"})


def test_devices_only_ever_see_their_sub_model():
    method = method_class("feddm")(SPEC, Recipe(), tree=False)
    for ins in method.configure_train(1, method.initial_weights(0), _devices(4)):
        ratio = ins.context["ratio"]
        assert ins.spec["layers"][0]["out"] == int(np.ceil(16 * ratio))
        assert ins.spec["layers"][-1]["out"] == 10
        own = state_numpy(build_model(ins.spec, seed=0))
        assert {k: v.shape for k, v in ins.weights.items()} == {k: v.shape for k, v in own.items()}


def test_pairwise_symmetric_kl_matches_scipy():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=(3, 4))  # 3 clients x 4 reference inputs x 5 classes
    kl = pairwise_symmetric_kl(p)
    for i in range(3):
        for j in range(3):
            pairs = [(entropy(p[i, b], p[j, b]) + entropy(p[j, b], p[i, b])) / 2 for b in range(4)]
            expected = np.mean(pairs)
            assert kl[i, j] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_tree_puts_clients_with_alike_labels_together():
    counts = np.zeros((6, 10))
    counts[:3, :5] = 20
    counts[3:, 5:] = 20
    counts += np.arange(60).reshape(6, 10) % 3  # some noise
    outputs = np.full((6, 4, 10), 0.1)
    distance = client_distance(outputs, label_distributions(counts), lam=1.0)
    labels = subtree_labels(build_tree(distance), 2)
    assert len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1 and labels[0] != labels[3]
    assert depth_levels(4, 2) == [0, 0, 1, 2]
    assert depth_levels(11, 0) == [0] * 11


def _digits_fleet(n: int, alpha: float):
    data = load_dataset("digits", seed=0)
    parts = partition(data.y_train, n, "dirichlet", seed=0, alpha=alpha)
    devices = [LocalDevice(DeviceInfo(f"dev{i:03d}", len(p), TIERS[i % 4]), data.x_train[p], data.y_train[p])
               for i, p in enumerate(parts)]
    counts = {d.info.device_id: row.tolist()
              for d, row in zip(devices, label_histogram(data.y_train, parts, 10), strict=True)}
    return data, devices, counts


def test_tree_cooperation_personalises_the_deeper_layers_by_subtree():
    data, devices, counts = _digits_fleet(6, alpha=0.1)
    method = FedDM(SPEC, Recipe(epochs=1, batch_size=16), reference=data.x_test[:32], label_counts=counts)
    result = run_rounds(method, devices, 2, seed=0)
    level2 = method.clusters["2"]  # the classifier (layers.9) is shared within 4 subtrees
    assert len(set(level2.values())) >= 2
    by_cluster: dict[int, list[str]] = {}
    for dev, cluster in level2.items():
        by_cluster.setdefault(cluster, []).append(dev)
    heads = {dev: method.personal[dev]["layers.9.weight"] for dev in level2}
    for members in by_cluster.values():
        assert all(np.array_equal(heads[members[0]], heads[m]) for m in members)
    firsts = [members[0] for members in by_cluster.values()]
    assert not np.array_equal(heads[firsts[0]], heads[firsts[1]])
    assert "layers.0.weight" not in method.personal["dev000"]  # shallow layers stay global
    # a device is sent its subtree's classifier, cut to its window
    info = devices[1].info
    (ins,) = method.configure_train(3, result.weights, [info])
    rows, cols = method.index_map(ins.context)["layers.9.weight"]
    sent = ins.weights["layers.9.weight"]
    np.testing.assert_array_equal(sent, heads[info.device_id][np.ix_(rows, cols)])
    assert not np.array_equal(sent, result.weights["layers.9.weight"][np.ix_(rows, cols)])


def test_feddm_plans_are_reproduced_after_a_restart():
    data, devices, counts = _digits_fleet(5, alpha=0.5)
    method = FedDM(SPEC, Recipe(epochs=1), reference=data.x_test[:16], label_counts=counts)
    result = run_rounds(method, devices, 2, seed=0)
    infos = [d.info for d in devices]
    before = method.configure_train(3, result.weights, infos)
    restarted = FedDM(SPEC, Recipe(epochs=1), reference=data.x_test[:16], label_counts=counts)
    restarted.load_state_dict(json.loads(json.dumps(method.state_dict())))
    for original, info in zip(before, infos, strict=True):
        (again,) = restarted.configure_train(3, result.weights, [info])  # one device at a time
        assert again.spec == original.spec and again.context == original.context
        assert all(np.array_equal(again.weights[k], original.weights[k]) for k in original.weights)
