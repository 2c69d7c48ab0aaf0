"""Unit tests of the torch runtime, the training recipe and runtime selection."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.base import StepStats
from sdk_device.runtimes.registry import available_runtimes, create_runtime, pick_runtime
from sdk_device.runtimes.torch_runtime import TorchRuntime

SHAPE = (1, 4, 4)


def _data(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two linearly separable classes: pixel mean -1 or +1 plus a little noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = (np.where(y == 1, 1.0, -1.0)[:, None, None, None] + 0.5 * rng.standard_normal((n, *SHAPE)))
    return x.astype(np.float32), y.astype(np.int64)


def _linear_spec() -> dict:
    return modelspec.make(SHAPE, 2, [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 2}])


def _exit_spec() -> dict:
    head = [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 2}]
    return modelspec.make(SHAPE, 2, [
        {"op": "conv2d", "in": 1, "out": 2, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 2}, {"op": "relu"},
        {"op": "exit", "head": [{"op": "flatten"}, {"op": "linear", "in": 32, "out": 2}]},
        {"op": "conv2d", "in": 2, "out": 1, "k": 1}, *head,
    ])


def _runtime(spec: dict) -> TorchRuntime:
    rt = TorchRuntime()
    rt.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    return rt


def _adversarial_start(rt: TorchRuntime) -> None:
    """Weights that get every sample wrong, so training has something to fix."""
    w = rt.get_weights()
    w["layers.1.weight"] = np.stack([np.full(16, 0.5), np.full(16, -0.5)]).astype(np.float32)
    w["layers.1.bias"] = np.zeros(2, np.float32)
    rt.set_weights(w)


# ---- training ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("adam", 0.05)])
def test_training_learns_a_separable_problem(optimizer, lr):
    x, y = _data()
    rt = _runtime(_linear_spec())
    _adversarial_start(rt)
    before = rt.evaluate(x, y)
    assert before.accuracy < 0.1
    w0 = rt.get_weights()
    stats = rt.train(x, y, Recipe(epochs=3, batch_size=16, optimizer=optimizer, lr=lr))
    after = rt.evaluate(x, y)
    assert isinstance(stats, StepStats) and stats.samples == len(y)
    assert after.loss < before.loss / 4
    assert after.accuracy > 0.95
    w1 = rt.get_weights()
    assert set(w1) == set(w0)
    assert not np.allclose(w0["layers.1.weight"], w1["layers.1.weight"])
    # a held-out sample of the same problem is classified as well
    xt, yt = _data(100, seed=1)
    assert rt.evaluate(xt, yt).accuracy > 0.95


def test_training_is_reproducible_with_the_same_seed():
    x, y = _data()
    results = []
    for _ in range(2):
        rt = _runtime(_linear_spec())
        _adversarial_start(rt)
        rt.train(x, y, Recipe(epochs=1, batch_size=32, seed=3))
        results.append(rt.get_weights()["layers.1.weight"])
    np.testing.assert_array_equal(results[0], results[1])


def test_multi_exit_training_and_reporting():
    x, y = _data(120)
    rt = _runtime(_exit_spec())
    fractions = []
    stats = rt.train(x, y, Recipe(epochs=2, batch_size=32, lr=0.05), progress=fractions.append)
    assert stats.samples == 120  # the last epoch only
    assert 0 <= stats.accuracy <= 1 and np.isfinite(stats.loss) and stats.loss > 0
    # progress: monotone, ends at exactly 1, one call per step (2 epochs x 4 steps)
    assert len(fractions) == 8
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    # batchnorm running statistics are part of the weights and were updated
    w = rt.get_weights()
    assert "layers.1.running_mean" in w and not np.allclose(w["layers.1.running_mean"], 0)
    assert not any(k.endswith("num_batches_tracked") for k in w)


def test_zero_epochs_is_refused():
    # a task that trains nothing would produce an update of zero samples, which the server refuses
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        Recipe(epochs=0)


# ---- evaluation ------------------------------------------------------------------------------------------

def test_evaluate_numbers_are_sensible():
    x, y = _data(90)
    rt = _runtime(_linear_spec())
    w = rt.get_weights()
    w["layers.1.weight"] = np.zeros((2, 16), np.float32)
    w["layers.1.bias"] = np.zeros(2, np.float32)
    rt.set_weights(w)
    stats = rt.evaluate(x, y, batch_size=7)  # uneven batches
    assert stats.samples == 90
    assert stats.loss == pytest.approx(np.log(2), rel=1e-5)  # uniform logits
    # argmax of equal logits is class 0
    assert stats.accuracy == pytest.approx(float(np.mean(y == 0)))
    _adversarial_start(rt)
    perfect_wrong = rt.evaluate(x, y)
    assert perfect_wrong.accuracy < 0.1


def test_evaluate_does_not_change_weights_or_batchnorm():
    x, y = _data(40)
    rt = _runtime(_exit_spec())
    w0 = rt.get_weights()
    rt.evaluate(x, y)
    for k, v in rt.get_weights().items():
        np.testing.assert_array_equal(v, w0[k])


def test_evaluate_batch_size_does_not_matter():
    x, y = _data(50)
    rt = _runtime(_linear_spec())
    a, b = rt.evaluate(x, y, batch_size=3), rt.evaluate(x, y, batch_size=256)
    assert a.samples == b.samples and a.accuracy == b.accuracy
    assert a.loss == pytest.approx(b.loss, rel=1e-5)


def test_runtime_needs_a_program():
    rt = TorchRuntime()
    with pytest.raises(RuntimeError):
        rt.get_weights()
    with pytest.raises(ValueError):
        rt.load_program(modelspec.dumps(_linear_spec()), "pte")
    with pytest.raises(modelspec.SpecError):
        rt.load_program(b"{}", modelspec.FORMAT)


# ---- recipe ----------------------------------------------------------------------------------------------

def test_recipe_defaults_and_round_trip():
    r = Recipe()
    assert (r.epochs, r.batch_size, r.optimizer, r.loss) == (1, 32, "sgd", "ce")
    custom = Recipe.from_dict({"epochs": 2, "lr": 0.01, "optimizer": "adam"})
    assert custom.optimizer == "adam" and custom.lr == 0.01 and custom.batch_size == 32
    assert Recipe.from_dict(custom.to_dict()) == custom
    assert Recipe.from_dict({}) == Recipe()


@pytest.mark.parametrize("data,match", [
    ({"epochz": 1}, "unknown recipe keys"),
    ({"lr": 0.1, "schedule": "cos"}, "schedule"),
    ({"optimizer": "rmsprop"}, "optimizer"),
    ({"loss": "mse"}, "loss"),
    ({"lr": 0}, "lr"),
    ({"lr": -0.1}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"epochs": -1}, "epochs"),
    ({"batch_size": 0}, "batch_size"),
    ({"lr": "0.1"}, "must be a finite float"),
    ({"epochs": "2"}, "must be a finite int"),
])
def test_recipe_rejects(data, match):
    with pytest.raises(ValueError, match=match):
        Recipe.from_dict(data)


def test_recipe_rejects_fractional_batch_size():
    with pytest.raises(ValueError):
        Recipe.from_dict({"batch_size": 2.5})


# ---- registry --------------------------------------------------------------------------------------------

def test_torch_is_available():
    assert "torch" in available_runtimes()


def test_pick_runtime_torch():
    assert pick_runtime(["torchspec/1"]) == ("torch", "torchspec/1")
    assert pick_runtime(["pte", "torchspec/1", "ort-training"]) == ("torch", "torchspec/1")
    assert pick_runtime(["torchspec/1"], allowed=["torch"]) == ("torch", "torchspec/1")


def test_pick_runtime_nothing_fits():
    with pytest.raises(ValueError) as info:
        pick_runtime(["pte", "ort-training"])
    assert "pte" in str(info.value) and "ort-training" in str(info.value)
    assert "torch" in str(info.value)  # says what is installed
    with pytest.raises(ValueError, match="none"):
        pick_runtime(["torchspec/1"], allowed=["no-such-runtime"])
    with pytest.raises(ValueError):
        pick_runtime([])


def test_create_runtime():
    import torch

    threads = torch.get_num_threads()
    try:
        rt = create_runtime("torch")  # sets torch's thread count to 1 for the whole process
    finally:
        torch.set_num_threads(threads)
    assert rt.name == "torch" and modelspec.FORMAT in rt.formats
    with pytest.raises(ValueError, match="unknown runtime"):
        create_runtime("tensorflow")
