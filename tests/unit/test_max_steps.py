"""``Recipe.max_steps``: a bound on a device's optimiser steps per training step, obeyed by
the torch runtime's loop and by the torch-free native ExecuTorch loop (both follow
``Recipe.epoch_steps``), carried in the task's recipe only when it is set."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .test_executorch_runtime import BATCH, CE
from .test_executorch_runtime import SPEC as PTE_SPEC

SPEC = modelspec.make((1, 8, 8), 10, [
    {"op": "conv2d", "in": 1, "out": 4, "k": 3, "stride": 1, "pad": 1, "bias": True},
    {"op": "relu"}, {"op": "flatten"}, {"op": "linear", "in": 256, "out": 10}])


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny tensors gain nothing from threads (see tests/conftest.py)."""


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, n)


def _train(recipe: Recipe, x: np.ndarray, y: np.ndarray, runtime=None, weights=None):
    """(stats, weights after, progress fractions reported) of one training pass."""
    if runtime is None:
        runtime = TorchRuntime()
        runtime.load_program(modelspec.dumps(SPEC), modelspec.FORMAT)
    if weights is not None:
        runtime.set_weights(weights)
    calls: list[float] = []
    stats = runtime.train(x, y, recipe, progress=calls.append)
    return stats, runtime.get_weights(), calls


def test_epoch_steps_cut_the_epochs_at_max_steps():
    assert Recipe(epochs=5, max_steps=100).epoch_steps(57) == [57, 43]
    assert Recipe(epochs=5, max_steps=0).epoch_steps(57) == [57] * 5
    assert Recipe(epochs=5, max_steps=30).epoch_steps(57) == [30]
    assert Recipe(epochs=2, max_steps=500).epoch_steps(12) == [12, 12]  # a bound above the work: no change
    assert Recipe(epochs=3, max_steps=8).epoch_steps(4) == [4, 4]
    assert Recipe(epochs=3, max_steps=8).epoch_steps(0) == []


def test_max_steps_travels_in_the_recipe_only_when_set():
    assert "max_steps" not in Recipe().to_dict()
    assert Recipe(max_steps=100).to_dict()["max_steps"] == 100
    assert Recipe.from_dict(Recipe(max_steps=7).to_dict()) == Recipe(max_steps=7)
    with pytest.raises(ValueError, match="max_steps must be >= 0"):
        Recipe(max_steps=-1)
    with pytest.raises(ValueError, match="max_steps"):
        Recipe.from_dict({"max_steps": 1.5})
    with pytest.raises(ValueError, match="max_steps"):
        Recipe.from_dict({"max_steps": True})


def test_the_torch_runtime_makes_at_most_max_steps_optimiser_steps():
    x, y = _data(64)  # 4 batches of 16 an epoch
    start = _train(Recipe(epochs=1, batch_size=16, lr=1e-9), x[:0], y[:0])[1]
    stats, _, calls = _train(Recipe(epochs=5, batch_size=16, max_steps=6, seed=3), x, y, weights=start)
    assert len(calls) == 6 and calls[-1] == pytest.approx(1.0)
    assert stats.samples == 64 and np.isfinite(stats.loss)  # the average's weight stays N
    unbounded = _train(Recipe(epochs=5, batch_size=16, max_steps=0, seed=3), x, y, weights=start)[2]
    assert len(unbounded) == 20


def test_a_bound_of_one_epoch_trains_exactly_what_one_epoch_trains():
    x, y = _data(64, seed=1)
    start = _train(Recipe(epochs=1, batch_size=16), x[:0], y[:0])[1]
    one_epoch = _train(Recipe(epochs=1, batch_size=16, seed=5), x, y, weights=start)
    bounded = _train(Recipe(epochs=5, batch_size=16, max_steps=4, seed=5), x, y, weights=start)
    assert all(np.array_equal(one_epoch[1][k], bounded[1][k]) for k in one_epoch[1])
    assert bounded[0] == one_epoch[0]
    two_epochs = _train(Recipe(epochs=2, batch_size=16, seed=5), x, y, weights=start)[1]
    assert any(not np.array_equal(two_epochs[k], bounded[1][k]) for k in two_epochs)


def test_the_native_executorch_loop_obeys_the_same_bound(program_for):
    from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime

    x, y = _data(4 * BATCH, seed=2)  # 4 batches an epoch

    def native():
        runtime = NativeExecutorchRuntime()
        runtime.load_program(program_for(PTE_SPEC, CE, BATCH), "pte/1")
        return runtime

    start = native().get_weights()
    bounded = _train(Recipe(epochs=3, batch_size=BATCH, max_steps=4, seed=1), x, y, native(), start)
    one_epoch = _train(Recipe(epochs=1, batch_size=BATCH, seed=1), x, y, native(), start)
    assert len(bounded[2]) == 4 and bounded[2][-1] == pytest.approx(1.0)
    assert bounded[0].samples == 4 * BATCH
    assert all(np.array_equal(one_epoch[1][k], bounded[1][k]) for k in one_epoch[1])
    assert len(_train(Recipe(epochs=3, batch_size=BATCH, max_steps=6, seed=1), x, y, native(), start)[2]) == 6
