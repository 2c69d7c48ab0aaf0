"""The in-process grid rejects what the MQTT grid rejects: a diverged device's NaN weights
never reach a method's aggregation (real torch training on digits)."""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds


def test_a_device_whose_training_diverges_is_rejected_and_the_model_stays_finite():
    data = load_dataset("digits", seed=0)
    x, y = data.x_train[:120], data.y_train[:120]
    broken = x[:40].copy()
    broken[0, 0, 0, 0] = np.nan  # one bad pixel: its training turns every weight into NaN
    devices = [LocalDevice(DeviceInfo("good0", 40, None), x[40:80], y[40:80]),
               LocalDevice(DeviceInfo("good1", 40, None), x[80:], y[80:]),
               LocalDevice(DeviceInfo("nan", 40, None), broken, y[:40])]
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    test = (data.x_test, data.y_test)
    result = run_rounds(method_class("fedavg")(spec, Recipe()), devices, 2, test, seed=0)
    assert [(r["accepted"], r["rejected"]) for r in result.rows] == [(2, 1), (2, 1)]
    assert all(np.isfinite(w).all() for w in result.weights.values())
    without = run_rounds(method_class("fedavg")(spec, Recipe()), devices[:2], 2, seed=0)
    assert all(np.array_equal(result.weights[k], without.weights[k]) for k in without.weights)
