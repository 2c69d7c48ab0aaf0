"""FedConv's speed-ups compute what the method computed before: the 1×1 block in closed form
(values and gradients of the two convs) and the evaluation's compression reused by the next
round (the same weights the round would have tuned, tuned once)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcore.recipe import Recipe
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedconv.conv_compress import BlockConfig, TensorPath, correlate_valid, tier_spec
from server_toolkit.methods.fedconv.fedconv import FedConv
from server_toolkit.models.zoo import model_spec


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    pass


def toy_data(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


def small_fedconv(**options) -> FedConv:
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    settings = {"pretrain_epochs": 1, "compress_epochs": 1, "dilate_epochs": 1, "aggregate_epochs": 1}
    return FedConv(spec, Recipe(epochs=1, batch_size=16, lr=0.05), **{**settings, **options})


def test_the_closed_form_1x1_block_matches_the_two_convs_in_values_and_gradients():
    """``TensorPath`` computes the 1×1 block (conv 1→16, ReLU, conv 16→1) as two slopes; the
    output and every gradient must be those of running the convs."""
    torch.manual_seed(3)
    path = TensorPath((64, 96), (16, 24), BlockConfig(init="random", keep_norm=False))
    torch.nn.init.normal_(path.reduce.weight)  # delta init zeroes it: the block would be the identity
    x = torch.randn(64, 96)

    def explicit() -> torch.Tensor:
        m = x.reshape(1, 1, 64, 96) * path.scale.view(-1, 1, 1, 1)
        m = m + path.reduce(F.relu(path.expand(m)))
        return correlate_valid(m, path.kernel()).reshape(16, 24)

    results = []
    for run in (explicit, lambda: path(x)):
        path.zero_grad()
        out = run()
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in path.parameters()]))
    (want, want_grads), (got, got_grads) = results
    up, down = (float(v.detach()) for v in path.block_slopes())
    assert up != 0 and down != 0  # both signs of expand's weights are present
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-4, rtol=1e-4)


def test_the_evaluations_deployable_model_is_the_next_rounds_compression_tuned_once(monkeypatch):
    """With fresh compressors, ``deployable`` tunes what the next round sends (same seed) and
    that round reuses it; different global weights are tuned afresh."""
    from server_toolkit.methods.fedconv import fedconv as module

    x, y = toy_data(60)
    device = DeviceInfo("d", 10, "0.5")
    plain = small_fedconv(compress_epochs=2)
    plain.attach_server_data(x, y)
    weights = plain.initial_weights(0)
    (expected,) = plain.configure_train(2, weights, [device])

    method = small_fedconv(compress_epochs=2)
    method.attach_server_data(x, y)
    method._start_round(1)  # after round 1's aggregation, the loop evaluates each tier
    calls = []
    tune = module.train_transform
    monkeypatch.setattr(module, "train_transform", lambda *a, **k: calls.append(1) or tune(*a, **k))
    spec, deployed = method.deployable(weights, device)
    assert spec == tier_spec(method.global_spec, 0.5) and len(calls) == 1
    assert method.deployable(weights, device)[1] is deployed and len(calls) == 1
    (instruction,) = method.configure_train(2, weights, [device])
    assert len(calls) == 1 and instruction.weights is deployed
    assert all(np.array_equal(deployed[k], expected.weights[k]) for k in deployed)
    assert method.aggregate_evaluate(2, [])["compress_acc"] >= 0
    method._start_round(2)
    method.deployable(weights, device)
    moved = {k: v + 0.01 for k, v in weights.items()}
    method.configure_train(3, moved, [device])
    assert len(calls) == 3  # round 3's global weights are not the evaluated ones: tuned again
