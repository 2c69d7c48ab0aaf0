"""The default recipe on the README's real fleet: two devices holding ~900 digits samples
each, FedAvg over the in-process grid (the device agent's own task code and torch loop).
With no bound a device makes 285 steps a round and the run can collapse; with the default
``max_steps`` it makes 100 and must keep its accuracy."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from fedcore.recipe import DEFAULT_MAX_STEPS, Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds
from server_toolkit.sim.simulate import DEFAULT_RECIPE

SPLIT = 0  # the seed of the split of all 1,797 digits into two devices (see BENCHMARKS.md)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny tensors gain nothing from threads (see tests/conftest.py)."""


def two_devices(split: int) -> list[LocalDevice]:
    """All of digits cut at random into two devices of 899 and 898 samples, as a user does."""
    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(split).permutation(len(y))
    return [LocalDevice(DeviceInfo(f"dev{i}", len(part), None), x[part], y[part])
            for i, part in enumerate((order[:899], order[899:]))]


def test_the_default_recipe_bounds_the_local_steps_of_a_large_device():
    assert DEFAULT_RECIPE.max_steps == DEFAULT_MAX_STEPS > 0
    assert sum(DEFAULT_RECIPE.epoch_steps(57)) == DEFAULT_MAX_STEPS  # 899 samples: 57 batches of 16
    assert sum(DEFAULT_RECIPE.epoch_steps(12)) == 60  # simulate's 8 digits shards: all 5 epochs


@pytest.mark.timeout(900)  # ~20 s of CPU; far more on a loaded 2-core machine
def test_two_devices_of_900_digits_keep_their_accuracy_over_20_rounds_with_the_default_recipe():
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    recipe = Recipe(**DEFAULT_RECIPE.to_dict())
    result = run_rounds(method_class("fedavg")(spec, recipe), two_devices(SPLIT), 20,
                        (data.x_test, data.y_test), seed=SPLIT)
    accuracy = [row["accuracy"] for row in result.rows]
    assert len(accuracy) == 20
    assert max(accuracy) >= 0.97, accuracy
    assert min(accuracy[5:]) >= 0.9, accuracy  # no round after the fifth falls away
    assert np.mean(accuracy[-5:]) >= max(accuracy) - 0.03, accuracy
