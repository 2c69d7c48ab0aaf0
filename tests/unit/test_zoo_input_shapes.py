"""Every model of the zoo builds for MNIST-sized (1, 28, 28) and digits-sized (1, 8, 8) inputs,
runs forward and takes a training step (random data: this checks shapes, not learning)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.models.architectures import ARCHITECTURES
from server_toolkit.models.zoo import ZOO, model_spec

MODELS = sorted({*ZOO, *ARCHITECTURES})
SHAPES = [(1, 28, 28), (1, 8, 8)]


def test_the_zoo_lists_every_model_the_cli_offers() -> None:
    assert set(MODELS) == {"small_cnn", "lenet5", "vgg_multi_exit", "resnet_small", "lenet", "vgg8",
                           "resnet10", "resnet12", "resnet18", "mlp"}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", MODELS)
def test_every_zoo_model_builds_runs_forward_and_trains_a_step_on_this_input_shape(
        name: str, shape: tuple[int, int, int], one_torch_thread) -> None:
    spec = model_spec(name, shape, 10)
    assert tuple(spec["input_shape"]) == shape and spec["num_classes"] == 10
    outputs = build_model(spec, seed=0)(torch.rand(3, *shape))
    assert outputs and all(tuple(o.shape) == (3, 10) for o in outputs)  # every exit and the final output

    rng = np.random.default_rng(0)
    x = rng.random((8, *shape), dtype=np.float32)
    y = rng.integers(0, 10, 8)
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    before = runtime.get_weights()
    stats = runtime.train(x, y, Recipe(epochs=1, batch_size=8, lr=0.05))  # one batch: one step
    assert stats.samples == 8 and np.isfinite(stats.loss)
    after = runtime.get_weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
