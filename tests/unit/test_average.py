"""Unit tests of weighted averaging (server_toolkit.reconstruct.average) and FedAvg."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models import zoo
from server_toolkit.reconstruct.average import weighted_average


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32)}


def test_weighted_average_matches_numpy():
    ups = [(_weights(i), n) for i, n in enumerate([10, 30, 60])]
    out = weighted_average(ups)
    assert set(out) == {"w", "b"}
    for name in ("w", "b"):
        stack = np.stack([u[name].astype(np.float64) for u, _ in ups])
        expected = np.average(stack, axis=0, weights=[10, 30, 60])
        hand = (10 * stack[0] + 30 * stack[1] + 60 * stack[2]) / 100
        np.testing.assert_allclose(out[name], expected, rtol=1e-6)
        np.testing.assert_allclose(out[name], hand, rtol=1e-6)
        assert out[name].dtype == np.float32
        assert out[name].shape == ups[0][0][name].shape


def test_equal_weights_give_the_mean():
    ups = [(_weights(i), 7) for i in range(4)]
    out = weighted_average(ups)
    np.testing.assert_allclose(out["w"], np.mean([u["w"] for u, _ in ups], axis=0), rtol=1e-6)


def test_weights_are_relative():
    a, b = _weights(0), _weights(1)
    x = weighted_average([(a, 1), (b, 3)])
    y = weighted_average([(a, 100), (b, 300)])
    np.testing.assert_allclose(x["w"], y["w"], rtol=1e-6)
    np.testing.assert_allclose(x["w"], 0.25 * a["w"] + 0.75 * b["w"], rtol=1e-5)


def test_single_update_is_identity():
    w = _weights(3)
    out = weighted_average([(w, 42)])
    for name in w:
        np.testing.assert_array_equal(out[name], w[name])
        assert out[name] is not w[name]  # a new array, the input is untouched


def test_zero_weight_update_is_ignored():
    a, b = _weights(0), _weights(1)
    out = weighted_average([(a, 5), (b, 0)])
    np.testing.assert_allclose(out["w"], a["w"], rtol=1e-6)


def test_float_sample_counts():
    a, b = _weights(0), _weights(1)
    out = weighted_average([(a, 0.5), (b, 1.5)])
    np.testing.assert_allclose(out["b"], 0.25 * a["b"] + 0.75 * b["b"], rtol=1e-5)


def test_integer_tensors_stay_integer_and_are_rounded():
    ups = [({"n": np.array([0, 10, 3], np.int64)}, 1), ({"n": np.array([1, 20, 4], np.int64)}, 2)]
    out = weighted_average(ups)
    assert out["n"].dtype == np.int64
    # exact means: [2/3, 50/3, 11/3] -> rounded to nearest
    np.testing.assert_array_equal(out["n"], [1, 17, 4])


def test_unsigned_and_small_int_dtypes_preserved():
    ups = [({"u": np.array([200], np.uint8), "i": np.array([-3], np.int32)}, 1),
           ({"u": np.array([100], np.uint8), "i": np.array([-5], np.int32)}, 1)]
    out = weighted_average(ups)
    assert out["u"].dtype == np.uint8 and out["u"][0] == 150  # no uint8 overflow
    assert out["i"].dtype == np.int32 and out["i"][0] == -4


def test_float64_precision_kept():
    ups = [({"x": np.array([1e-12], np.float64)}, 1), ({"x": np.array([3e-12], np.float64)}, 1)]
    out = weighted_average(ups)
    assert out["x"].dtype == np.float64 and out["x"][0] == pytest.approx(2e-12, rel=1e-12)


def test_empty_list_raises():
    with pytest.raises(ValueError, match="nothing"):
        weighted_average([])


@pytest.mark.parametrize("counts", [[0], [0, 0], [3, -3], [-1]])
def test_zero_or_negative_total_raises(counts):
    with pytest.raises(ValueError, match="more than zero"):
        weighted_average([(_weights(i), n) for i, n in enumerate(counts)])


# ---- FedAvg --------------------------------------------------------------------------------------

SPEC = zoo.model_spec("small_cnn", (1, 8, 8), 10, width=4)


def test_fedavg_configure_train_gives_everyone_the_global_model():
    recipe = Recipe(epochs=2, lr=0.01)
    method = FedAvg(SPEC, recipe)
    weights = method.initial_weights(seed=0)
    devices = [DeviceInfo("a", 10, tier="small"), DeviceInfo("b", 20, tier="large"), DeviceInfo("c", 5)]
    instructions = method.configure_train(1, weights, devices)
    assert [i.device_id for i in instructions] == ["a", "b", "c"]
    for ins in instructions:
        assert isinstance(ins, TrainInstruction)
        assert ins.spec == SPEC
        assert ins.recipe == recipe
        assert ins.context == {}
        assert set(ins.weights) == set(weights)
        for name, arr in weights.items():
            np.testing.assert_array_equal(ins.weights[name], arr)


def test_fedavg_initial_weights_are_seeded():
    method = FedAvg(SPEC, Recipe())
    a, b, c = method.initial_weights(1), method.initial_weights(1), method.initial_weights(2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_fedavg_no_devices():
    method = FedAvg(SPEC, Recipe())
    assert method.configure_train(1, method.initial_weights(0), []) == []


def test_fedavg_aggregate_is_sample_weighted():
    method = FedAvg(SPEC, Recipe())
    g = method.initial_weights(0)
    ins = method.configure_train(1, g, [DeviceInfo("a", 1), DeviceInfo("b", 3)])
    wa = {k: v + 1.0 for k, v in g.items()}
    wb = {k: v - 1.0 for k, v in g.items()}
    updates = [ClientUpdate("a", 1, wa, {"loss": 1.0, "accuracy": 0.5}, ins[0]),
               ClientUpdate("b", 3, wb, {"loss": 2.0, "accuracy": 1.0}, ins[1])]
    new = method.aggregate_train(1, g, updates)
    for k in g:
        np.testing.assert_allclose(new[k], g[k] - 0.5, rtol=1e-5, atol=1e-6)
    ev = method.aggregate_evaluate(1, updates)
    assert ev["device_loss"] == pytest.approx(1.75)
    assert ev["device_accuracy"] == pytest.approx(0.875)
