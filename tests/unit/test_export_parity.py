"""Gradient parity of ExecuTorch training programs against torch autograd.

The matrix of the export issue: MLP, CNN + max-pool, CNN + BatchNorm (train mode),
CNN + average / adaptive pools, a residual network, the multi-exit VGG (summed exit
losses, dropout with shared masks), a depthwise-separable network, and the KD,
RecipFL-KT and DepthFL self-distillation losses (the last on a tiny 2-exit model).
For each: loss within 1e-5 and every gradient within 1e-5 * max(1, max |grad|) of torch;
5 optimizer steps (SGD with momentum and weight decay, Adam; the last batch is short, so
padding + masking is exercised) within 1e-4 of torch.optim; eval outputs within 1e-4.

Exporting takes seconds per program: programs are cached across runs (see pte_cache).
"""

from __future__ import annotations

import numpy as np
import pytest

from export.parity import eval_parity, gradient_parity, kink_margin, training_parity
from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.models.zoo import model_spec

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture

BATCH = 8
LOSS_TOL, GRAD_TOL, STEP_TOL, EVAL_TOL = 1e-5, 1e-5, 1e-4, 1e-4
CE = {"kind": "ce"}


def _conv(cin, cout, k=3, pad=1, **extra):
    return {"op": "conv2d", "in": cin, "out": cout, "k": k, "pad": pad, **extra}


MODELS = {
    "mlp": modelspec.make((1, 8, 8), 5, [
        {"op": "flatten"}, {"op": "linear", "in": 64, "out": 16}, {"op": "relu"},
        {"op": "linear", "in": 16, "out": 5}]),
    "cnn_maxpool": model_spec("small_cnn", (1, 8, 8), 5, width=4),
    "cnn_batchnorm": modelspec.make((3, 8, 8), 5, [
        _conv(3, 4, bias=False), {"op": "batchnorm2d", "c": 4}, {"op": "relu"}, {"op": "maxpool2d", "k": 2},
        _conv(4, 6), {"op": "batchnorm2d", "c": 6, "track": False}, {"op": "relu"},
        {"op": "flatten"}, {"op": "linear", "in": 96, "out": 5}]),
    "cnn_avgpool": modelspec.make((1, 9, 9), 5, [
        _conv(1, 4), {"op": "relu"}, {"op": "avgpool2d", "k": 2},  # 9 -> 4: the odd edge is dropped
        _conv(4, 6, k=5, pad=2), {"op": "relu"}, {"op": "gap"}, {"op": "flatten"},
        {"op": "linear", "in": 6, "out": 5}]),
    "residual": model_spec("resnet_small", (3, 8, 8), 5, widths=(4, 8)),
    "vgg_multi_exit": model_spec("vgg_multi_exit", (3, 8, 8), 5, channels=(4, 8, 8), exits_after=(1, 2)),
    "depthwise_separable": modelspec.make((3, 8, 8), 5, [
        _conv(3, 8), {"op": "relu"},
        _conv(8, 8, groups=8), _conv(8, 12, k=1, pad=0), {"op": "relu"},  # depthwise + pointwise
        _conv(12, 8, stride=2, groups=4, bias=False), {"op": "batchnorm2d", "c": 8}, {"op": "relu"},
        {"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": 8, "out": 5}]),
}
# DepthFL's self-distillation needs several outputs; a tiny 2-exit model keeps its export short.
SD_MODELS = {
    "two_exit": modelspec.make((1, 8, 8), 5, [
        _conv(1, 4), {"op": "relu"}, {"op": "maxpool2d", "k": 2},
        {"op": "exit", "head": [{"op": "flatten"}, {"op": "linear", "in": 64, "out": 5}]},
        _conv(4, 4), {"op": "relu"}, {"op": "maxpool2d", "k": 2},
        {"op": "flatten"}, {"op": "linear", "in": 16, "out": 5}]),
}
SPECS = {**MODELS, **SD_MODELS}
KD = {"kind": "kd", "temperature": 3.0, "alpha": 0.7}
KT = {"kind": "recipfl_kt", "features": 64}  # small_cnn's features: the 64-unit hidden layer
SD = {"kind": "depthfl_sd", "temperature": 2.0, "alpha": 0.8}  # T != 1 and w != 1 exercise both factors
CASES = [(name, CE) for name in MODELS] + [("cnn_maxpool", KD), ("cnn_maxpool", KT), ("two_exit", SD)]


def _case_id(case) -> str:
    return f"{case[0]}-{case[1]['kind']}"


def _weights(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """Initial weights with non-trivial BN running statistics."""
    rng = np.random.default_rng(seed)
    weights = state_numpy(build_model(spec, seed=seed))
    for name, value in weights.items():
        if name.endswith("running_mean"):
            weights[name] = rng.normal(0, 0.3, value.shape).astype(np.float32)
        elif name.endswith("running_var"):
            weights[name] = rng.uniform(0.5, 2.0, value.shape).astype(np.float32)
    return weights


def _data(spec: dict, n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *spec["input_shape"])).astype(np.float32)
    return x, rng.integers(0, spec["num_classes"], n)


def _extras(loss: dict, n: int, spec: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 7)
    extras = {}
    if loss["kind"] in ("kd", "recipfl_kt"):
        extras["teacher_logits"] = (2 * rng.standard_normal((n, spec["num_classes"]))).astype(np.float32)
    if loss["kind"] == "recipfl_kt":
        extras["teacher_features"] = rng.standard_normal((n, loss["features"])).astype(np.float32)
    return extras


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_loss_and_gradients_match_torch(case, program_for):
    name, loss = case
    spec = SPECS[name]
    program = program_for(spec, loss, BATCH)
    x, y = _data(spec, BATCH, seed=1)
    result = gradient_parity(program, spec, _weights(spec, 2), x, y, loss, _extras(loss, BATCH, spec, 1))
    assert result.loss_error <= LOSS_TOL, result
    assert result.grad_error <= GRAD_TOL, result
    assert result.running_error <= 1e-5, result


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_five_optimizer_steps_match_torch(case, optimizer, program_for):
    name, loss = case
    spec = SPECS[name]
    program = program_for(spec, loss, BATCH)
    n = 4 * BATCH + BATCH // 2  # 5 steps, the last one on half a batch (padded + masked)
    x, y = _data(spec, n, seed=3)
    if optimizer == "sgd":
        recipe = Recipe(epochs=1, batch_size=BATCH, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3)
    else:
        recipe = Recipe(epochs=1, batch_size=BATCH, optimizer="adam", lr=0.01, weight_decay=1e-3)
    diff = training_parity(program, spec, _weights(spec, 4), x, y, recipe, loss, _extras(loss, n, spec, 3))
    assert diff <= STEP_TOL


def test_training_with_the_fedprox_term_matches_torch(program_for):
    spec = MODELS["cnn_maxpool"]
    program = program_for(spec, CE, BATCH)
    x, y = _data(spec, 3 * BATCH, seed=3)
    recipe = Recipe(epochs=2, batch_size=BATCH, lr=0.05, momentum=0.9, prox_mu=0.5)
    assert training_parity(program, spec, _weights(spec, 4), x, y, recipe, CE) <= STEP_TOL


@pytest.mark.parametrize("name", list(MODELS))
def test_eval_outputs_match_torch(name, program_for):
    spec = MODELS[name]
    x, _ = _data(spec, BATCH - 3, seed=5)  # a short batch: padded, masked out of static-BN statistics
    assert eval_parity(program_for(spec, CE, BATCH), spec, _weights(spec, 6), x) <= EVAL_TOL


def test_the_check_fails_on_a_different_loss(program_for):
    """The comparison can fail: a KD program scored against torch's plain CE differs."""
    spec = MODELS["cnn_maxpool"]
    x, y = _data(spec, BATCH, seed=1)
    extras = _extras(KD, BATCH, spec, 1)
    result = gradient_parity(program_for(spec, KD, BATCH), spec, _weights(spec, 2), x, y, CE, extras)
    assert result.loss_error > LOSS_TOL and result.grad_error > GRAD_TOL


def test_the_kink_margin_is_the_closest_relu_input_to_zero_or_max_pool_near_tie():
    """ReLU inputs (the identity layer's outputs) and max-pool windows (ties of exact zeros
    do not count: every implementation gives them to the first maximum)."""
    spec = modelspec.make((1, 2, 4), 2, [
        {"op": "relu"}, {"op": "maxpool2d", "k": 2}, {"op": "flatten"}, {"op": "linear", "in": 2, "out": 2}])
    weights = state_numpy(build_model(spec, seed=0))
    x = np.array([[[[1.0, 0.9997, -0.1, -2.0], [0.5, 0.25, -0.5, -1.0]]]], np.float32)  # gaps 3e-4 and 0
    assert kink_margin(spec, weights, x) == pytest.approx(1.0 - np.float64(np.float32(0.9997)))
    x[0, 0, 1, 1] = -1e-5  # a ReLU input nearer 0 than the pool gap
    assert kink_margin(spec, weights, x) == pytest.approx(np.float64(np.float32(1e-5)))
