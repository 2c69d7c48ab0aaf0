"""Scatter of sub-model results (server_toolkit/methods/width/coverage.py) and the width
methods' aggregation: round trip, brute-force coverage, FedAvg at r = 1."""

import itertools

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.width.coverage import coverage_average, coverage_counts
from server_toolkit.models.zoo import model_spec
from server_toolkit.reconstruct.average import weighted_average
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.partition import partition
from server_toolkit.submodels.width import extract, static_bn, width_layout, window

SPEC = static_bn(model_spec("resnet_small", (1, 8, 8), 10))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine is shared: one thread is faster here
    yield
    torch.set_num_threads(threads)


def _random_blocks(rng, shape, clients):
    """Each client: a random cyclic window on axes 0 and 1 and a sample count."""
    blocks = []
    for _ in range(clients):
        rows = window(shape[0], int(rng.integers(1, shape[0] + 1)), int(rng.integers(shape[0])))
        cols = window(shape[1], int(rng.integers(1, shape[1] + 1)), int(rng.integers(shape[1])))
        blocks.append(((rows, cols), int(rng.integers(1, 50))))
    return blocks


def test_coverage_counts_match_brute_force_on_a_small_layer():
    rng = np.random.default_rng(0)
    shape = (6, 4, 3, 3)
    blocks = _random_blocks(rng, shape, clients=5)
    counts = coverage_counts(shape, blocks)
    expected = np.zeros(shape)
    for i, j, a, b in itertools.product(*(range(d) for d in shape)):
        expected[i, j, a, b] = sum(n for (rows, cols), n in blocks if i in rows and j in cols)
    np.testing.assert_array_equal(counts, expected)


def test_coverage_average_matches_brute_force_per_element():
    rng = np.random.default_rng(1)
    shape = (5, 3, 2, 2)
    current = rng.normal(size=shape).astype(np.float32)
    blocks = _random_blocks(rng, shape, clients=3)
    values = [rng.normal(size=(len(r), len(c), 2, 2)).astype(np.float32) for (r, c), _ in blocks]
    merged = coverage_average({"w": current},
                              [({"w": v}, {"w": idx}, n) for v, (idx, n) in zip(values, blocks, strict=True)])
    expected = current.astype(np.float64).copy()
    for i, j in itertools.product(range(shape[0]), range(shape[1])):
        covering = [(v[list(r).index(i), list(c).index(j)], n)
                    for v, ((r, c), n) in zip(values, blocks, strict=True) if i in r and j in c]
        if covering:
            expected[i, j] = sum(x * n for x, n in covering) / sum(n for _, n in covering)
    np.testing.assert_allclose(merged["w"], expected, rtol=1e-6, atol=1e-7)
    uncovered = coverage_counts(shape, blocks) == 0
    np.testing.assert_array_equal(merged["w"][uncovered], current[uncovered])


@pytest.mark.parametrize("ratio", (1.0, 0.75, 0.5, 0.25))
def test_extract_then_scatter_is_the_identity(ratio):
    layout = width_layout(SPEC)
    weights = state_numpy(build_model(SPEC, seed=0))
    rng = np.random.default_rng(2)
    parts = []
    for n in (3, 7, 11):  # three clients, each with its own windows
        plan = layout.plan(ratio, {s: int(rng.integers(layout.sizes[s])) for s in layout.hidden_spaces})
        parts.append((extract(weights, plan.index_map), plan.index_map, n))
    merged = coverage_average(weights, parts)
    assert all(np.array_equal(merged[k], weights[k]) for k in weights)


def test_full_windows_reproduce_weighted_average_bit_for_bit():
    layout = width_layout(SPEC)
    rng = np.random.default_rng(3)
    plan = layout.plan(1.0, {s: 5 for s in layout.hidden_spaces})
    base = state_numpy(build_model(SPEC, seed=0))
    updates = [({k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in base.items()}, n)
               for n in (13, 40, 7)]
    merged = coverage_average(base, [(w, plan.index_map, n) for w, n in updates])
    fedavg = weighted_average(updates)
    assert all(np.array_equal(merged[k], fedavg[k]) for k in base)


def test_a_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        coverage_average({"w": np.zeros((4, 4), np.float32)},
                         [({"w": np.zeros((2, 3), np.float32)}, {"w": (np.arange(2), np.arange(2))}, 1)])


@pytest.mark.parametrize("name, options", [("heterofl", {}), ("fedrolex", {}), ("feddm", {"tree": False})])
def test_clients_at_full_ratio_train_exactly_like_fedavg(name, options):
    data = load_dataset("digits", seed=0)
    parts = partition(data.y_train, 3, "dirichlet", seed=0, alpha=0.5)
    devices = [LocalDevice(DeviceInfo(f"dev{i}", len(p), "1.0"), data.x_train[p], data.y_train[p])
               for i, p in enumerate(parts)]
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    recipe = Recipe(epochs=1, batch_size=16, lr=0.05)
    width = run_rounds(method_class(name)(spec, recipe, **options), devices, 2, (data.x_test, data.y_test))
    fedavg = run_rounds(FedAvg(static_bn(spec), recipe), devices, 2, (data.x_test, data.y_test))
    untimed = [[{k: v for k, v in row.items() if k != "seconds" and not k.endswith("_s")} for row in rows]
               for rows in (width.rows, fedavg.rows)]
    assert untimed[0] == untimed[1]
    assert all(np.array_equal(width.weights[k], fedavg.weights[k]) for k in fedavg.weights)
