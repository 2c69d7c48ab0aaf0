"""FedProx: the devices' recipe carries the proximal weight, and the term keeps a device's
model near the global one (real training of the torch runtime on digits)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.models.zoo import model_spec

DATA = load_dataset("digits", seed=0)
SPEC = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)


def _drift(mu: float) -> float:
    """How far one device's task moves the weights (L2), trained by the runtime from the
    instruction FedProx sends."""
    method = method_class("fedprox")(SPEC, Recipe(epochs=3, lr=0.05), mu=mu)
    weights = method.initial_weights(0)
    [instruction] = method.configure_train(1, weights, [DeviceInfo("d0", 200, None)])
    assert Recipe.from_dict(instruction.recipe.to_dict()).prox_mu == mu  # on the wire
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(instruction.spec), modelspec.FORMAT)
    runtime.set_weights(instruction.weights)
    runtime.train(DATA.x_train[:200], DATA.y_train[:200], instruction.recipe)
    trained = runtime.get_weights()
    return float(np.sqrt(sum(((trained[k] - weights[k]) ** 2).sum() for k in weights)))


def test_a_strong_proximal_term_keeps_the_device_model_near_the_global_one():
    assert _drift(10.0) < 0.5 * _drift(0.0)


def test_fedprox_rejects_a_negative_mu():
    with pytest.raises(ValueError, match="mu"):
        method_class("fedprox")(SPEC, Recipe(), mu=-0.1)
