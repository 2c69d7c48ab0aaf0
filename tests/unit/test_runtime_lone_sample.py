"""A trailing batch of one sample joins the batch before it (BatchNorm cannot train on one)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.models.zoo import vgg_multi_exit


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny tensors gain nothing from threads (see tests/conftest.py)."""


def test_vgg_on_8x8_trains_when_one_sample_would_be_left_over():
    spec = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 8))  # last block: BN over a 1x1 map
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    rng = np.random.default_rng(0)
    x, y = rng.random((17, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 17)
    stats = runtime.train(x, y, Recipe(epochs=2, batch_size=8, optimizer="adam", lr=1e-3))
    assert stats.samples == 17 and np.isfinite(stats.loss)  # 8 + 9: the 17th sample is not dropped
    stats = runtime.train(x[:9], y[:9], Recipe(epochs=1, batch_size=4, optimizer="adam", lr=1e-3))
    assert stats.samples == 9
    stats = runtime.train(x[:10], y[:10], Recipe(epochs=1, batch_size=4, optimizer="adam", lr=1e-3))
    assert stats.samples == 10  # a trailing batch of two is kept


def test_batch_bounds_cover_every_sample():
    from fedcore.torch_train import batch_bounds

    assert batch_bounds(17, 8) == [(0, 8), (8, 17)]
    assert batch_bounds(16, 8) == [(0, 8), (8, 16)]
    assert batch_bounds(1, 8) == [(0, 1)]
    assert batch_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
