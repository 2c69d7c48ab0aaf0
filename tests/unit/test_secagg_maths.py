"""The maths of secure aggregation (fedcore/secagg): Shamir t of n, masks that cancel,
fixed point and its no-wrap range, global-coordinate scatter of width windows, the neighbour
graph; and in-process secure rounds of HeteroFL and DepthFL equal to their plain aggregates."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.secagg import crypto, fixed_point, masks, shamir
from fedcore.secagg.graph import default_degree, neighbours
from fedcore.secagg.layout import Layout, Placement
from fedcore.secagg.wire import threshold
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.exit.depthfl import DepthFL
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec
from server_toolkit.secagg.aggregate import layout_for, next_weights, refusal
from server_toolkit.secagg.inprocess import run_secure_round
from server_toolkit.secagg.protocol import SecAggFailed


def test_any_t_of_n_shamir_shares_rebuild_the_secret_and_fewer_do_not():
    secret = bytes(range(32))
    shares = shamir.share(secret, 3, [1, 2, 3, 4, 5])
    for picked in ([1, 2, 3], [2, 4, 5], [1, 3, 5, 4]):
        assert shamir.reconstruct({x: shares[x] for x in picked}, 3) == secret
    with pytest.raises(ValueError):
        shamir.reconstruct({1: shares[1], 2: shares[2]}, 3)
    other = shamir.share(bytes(32), 3, [1, 2, 3])
    with pytest.raises(ValueError):  # a foreign share: the result is no 32-byte secret
        shamir.reconstruct({1: shares[1], 2: shares[2], 3: other[3]}, 3)


def test_pairwise_masks_from_x25519_cancel_in_the_sum():
    keys = {d: crypto.new_private() for d in ("a", "b", "c")}
    vectors = {d: np.full(1000, 7, np.uint64) for d in keys}
    for me in keys:
        for other in keys:
            if me != other:
                seed = crypto.agree(keys[me], crypto.public_bytes(keys[other]), crypto.MASK_INFO, b"r1")
                masks.apply(vectors[me], seed, masks.pairwise_sign(me, other))
    assert not (vectors["a"] == 7).any()  # each vector alone is masked
    assert (sum(vectors.values()) == 21).all()  # uint64 wraps: the masks cancel exactly


def test_fixed_point_round_trips_within_its_resolution_and_refuses_values_out_of_range():
    values = np.array([0.0, 1.5, -2.25, 1e-7, -999.999, 123.456789])
    back = fixed_point.decode(fixed_point.encode(values))
    assert np.abs(back - values).max() <= 0.5 / fixed_point.SCALE
    summed = fixed_point.encode(values) + fixed_point.encode(-values * 2)
    assert np.abs(fixed_point.decode(summed) + values).max() <= 1 / fixed_point.SCALE
    with pytest.raises(ValueError):
        fixed_point.encode(np.array([2.0**63 / fixed_point.SCALE]))
    # no wrap: the largest allowed weighted sum still decodes with the right sign
    top = fixed_point.max_total_weight() * fixed_point.CLIP * 0.999
    decoded = fixed_point.decode(fixed_point.encode(np.array([top, -top])))
    assert decoded.tolist() == pytest.approx([top, -top])


def test_a_window_scatters_into_global_coordinates_and_overlapping_windows_average_per_element():
    # global tensor 4x3 at offset 2 of a 14-element vector; two devices' windows overlap in rows 1-2
    rows_a, rows_b = np.array([0, 1, 2]), np.array([1, 2, 3])
    layout_a = Layout(14, {"w": Placement(2, (4, 3), (rows_a,))}, per_element=True)
    layout_b = Layout.from_json(Layout(14, {"w": Placement(2, (4, 3), (rows_b,))}, True).to_json())
    va, ca = layout_a.scatter({"w": np.ones((3, 3))}, 2, None, clip=10.0)
    vb, cb = layout_b.scatter({"w": np.full((3, 3), 4.0)}, 1, None, clip=10.0)
    assert va[:2].tolist() == [0, 0] and va[2:14].reshape(4, 3)[3].tolist() == [0, 0, 0]
    mean = ((va + vb) / np.where(ca + cb > 0, ca + cb, 1))[2:].reshape(4, 3)
    assert mean[0].tolist() == [1, 1, 1] and mean[3].tolist() == [4, 4, 4]
    assert mean[1].tolist() == pytest.approx([2, 2, 2])  # (2*1 + 1*4) / 3
    clipped, _ = layout_a.scatter({"w": np.full((3, 3), 50.0)}, 1, None, clip=10.0)
    assert clipped.max() == 10.0


def test_the_neighbour_graph_is_symmetric_k_regular_and_seeded():
    devices = [f"d{i:04d}" for i in range(1000)]
    k = default_degree(1000)
    assert k < 200 and default_degree(10) == 9  # sparse at scale, complete when small
    graph = neighbours(devices, k, seed=3)
    assert all(len(v) == k for v in graph.values())
    assert all(d in graph[n] for d, ns in graph.items() for n in ns)
    assert graph == neighbours(devices, k, seed=3) != neighbours(devices, k, seed=4)
    assert threshold(k, 0.5) > k / 2


def test_a_secure_heterofl_round_equals_the_plain_one_with_devices_dropping_and_fails_with_too_many():
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    method = HeteroFL(spec, Recipe(), tier_ratios={"a": 1.0, "b": 0.5})
    before = method.initial_weights(0)
    devices = [DeviceInfo(f"d{i}", 10 + i, tier="ab"[i % 2]) for i in range(8)]
    instructions = method.configure_train(1, before, devices)
    rng = np.random.default_rng(0)
    noisy = {i.device_id: {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in i.weights.items()}
             for i in instructions}
    trained = {dev: (w, 10 + int(dev[1:]), None) for dev, w in noisy.items()}
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    stats = run_secure_round(1, layouts, trained, drop={"d3", "d6"})
    assert stats.dropped == ["d3", "d6"]
    secure = next_weights(method, 1, before, stats.total, layouts["d0"], instructions[0])
    plain = method.aggregate_train(1, before, [ClientUpdate(i.device_id, trained[i.device_id][1],
                                                            trained[i.device_id][0], {}, i)
                                               for i in instructions if i.device_id not in {"d3", "d6"}])
    assert max(np.abs(secure[n] - plain[n]).max() for n in plain) <= 1e-5
    with pytest.raises(SecAggFailed):  # 5 of 8 gone: survivors keep 2 < t = 4 neighbours
        run_secure_round(1, layouts, trained, drop={"d1", "d2", "d3", "d4", "d5"})


def test_methods_that_need_each_devices_update_are_refused_in_one_line():
    assert refusal(method_class("fedavg")) is None and refusal(method_class("depthfl")) is None
    for name in ("hypemefed", "feddm", "fedconv", "recipfl", "pfedhn"):
        why = refusal(method_class(name))
        assert "--secagg does not support" in why and "\n" not in why


def test_a_secure_depthfl_round_equals_the_plain_one_with_classwise_heads():
    spec = model_spec("vgg_multi_exit", (1, 8, 8), 10)
    method = DepthFL(spec, Recipe())
    before = method.initial_weights(0)
    instructions = method.configure_train(1, before, [DeviceInfo(f"d{i}", 20, tier=str(i % 3 + 1))
                                                      for i in range(4)])
    rng = np.random.default_rng(1)
    trained = {}
    for i in instructions:
        counts = np.bincount(rng.integers(0, 4 + int(i.device_id[1:]), 20), minlength=10)  # label skew
        noisy = {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
                 for k, v in i.weights.items()}
        trained[i.device_id] = (noisy, 20, counts)
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    stats = run_secure_round(1, layouts, trained)
    secure = next_weights(method, 1, before, stats.total, layouts["d0"], instructions[0])
    plain = method.aggregate_train(1, before, [
        ClientUpdate(i.device_id, 20, trained[i.device_id][0],
                     {"label_counts": trained[i.device_id][2].tolist()}, i) for i in instructions])
    assert method.classifiers  # the classwise path is exercised
    assert max(np.abs(secure[n].astype(np.float64) - plain[n]).max() for n in plain) <= 1e-5
