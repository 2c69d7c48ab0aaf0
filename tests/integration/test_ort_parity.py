"""Gradient and optimizer parity of ONNX Runtime training programs with torch autograd.

Each model is exported here (main venv: torch -> ONNX, ORT artifact generation in the ORT
environment) and trained by ``OrtTrainingRuntime`` in the ORT environment
(``tests/ort_worker.py``); torch computes the same things in this process. Checked per
model: loss within 1e-5, every gradient within 1e-5 * max(1, max |grad|), BatchNorm
running statistics after the step, eval outputs within 1e-4, and the weights after
``train`` (5 steps: 4 full batches + a short last one) with SGD-momentum and with Adam
within 1e-4 of torch's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from export import onnx as onnx_export
from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, load_numpy, state_numpy
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.zoo import model_spec

from ..ort_env import run_ort

pytestmark = pytest.mark.integration

SHAPE, CLASSES = (1, 8, 8), 10
RECIPES = [
    Recipe(epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, seed=3),
    Recipe(epochs=1, batch_size=16, optimizer="adam", lr=1e-3, weight_decay=1e-4, seed=4),
]
TRAIN_SAMPLES = 70  # 16 + 16 + 16 + 16 + 6: the last batch is short


class Chain(nn.Module):
    """Layers in sequence; forward returns a 1-tuple of logits like spec models."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.layers(x),)


def _mlp() -> dict:
    return modelspec.make(SHAPE, CLASSES, [{"op": "flatten"}, {"op": "linear", "in": 64, "out": 32},
                                          {"op": "relu"}, {"op": "linear", "in": 32, "out": CLASSES}])


def _cnn_bn() -> dict:
    return modelspec.make(SHAPE, CLASSES, [
        {"op": "conv2d", "in": 1, "out": 6, "k": 3, "pad": 1, "bias": False}, {"op": "batchnorm2d", "c": 6},
        {"op": "relu"}, {"op": "maxpool2d", "k": 2},
        {"op": "conv2d", "in": 6, "out": 8, "k": 3, "pad": 1, "bias": False}, {"op": "batchnorm2d", "c": 8},
        {"op": "relu"}, {"op": "flatten"}, {"op": "linear", "in": 128, "out": CLASSES}])


def _cnn_avgpool() -> nn.Module:
    torch.manual_seed(5)
    return Chain(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Conv2d(6, 8, 3, padding=1),
                 nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, CLASSES))


def _depthwise_separable() -> nn.Module:
    torch.manual_seed(6)
    return Chain(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                 nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                 nn.Conv2d(8, 16, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, CLASSES))


CASES = {  # name -> (spec or torch model factory, loss recipe)
    "mlp": (_mlp, {"kind": "ce"}),
    "cnn_maxpool": (lambda: model_spec("small_cnn", SHAPE, CLASSES, width=4), {"kind": "ce"}),
    "cnn_batchnorm": (_cnn_bn, {"kind": "ce"}),
    "cnn_avg_adaptive_pool": (_cnn_avgpool, {"kind": "ce"}),
    "residual": (lambda: model_spec("resnet_small", SHAPE, CLASSES, widths=(4, 8)), {"kind": "ce"}),
    "vgg_multi_exit": (lambda: model_spec("vgg_multi_exit", SHAPE, CLASSES, channels=(4, 8, 8, 16),
                                          dropout=0.0), {"kind": "ce"}),
    "depthwise_separable": (_depthwise_separable, {"kind": "ce"}),
    "kd": (lambda: model_spec("small_cnn", SHAPE, CLASSES, width=4),
           {"kind": "kd", "alpha": 0.5, "temperature": 3.0}),
    "recipfl_kt": (_mlp, {"kind": "recipfl_kt", "features": 32}),
}


def _torch_model(factory) -> nn.Module:
    made = factory()
    return build_model(made, seed=2) if isinstance(made, dict) else made


def _kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Batch mean of KL(softmax(teacher) || softmax(student))."""
    p = F.softmax(teacher_logits, dim=1)
    return (p * (torch.log(p) - F.log_softmax(student_logits, dim=1))).sum(1).mean()


def _reference_loss(loss: dict, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    extras: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss recipes of fedcore.losses, written out independently with torch ops."""
    hidden = {}
    hook = model.layers[-1].register_forward_pre_hook(lambda m, a: hidden.update(features=a[0]))
    outputs = model(x)
    hook.remove()
    ce = sum(F.cross_entropy(o, y) for o in outputs)
    if loss["kind"] == "ce":
        return ce
    if loss["kind"] == "kd":  # distillation on the final output only
        t, a = loss["temperature"], loss["alpha"]
        return (1 - a) * ce + a * t * t * _kl(extras["teacher_logits"] / t, outputs[-1] / t)
    soft = -(F.softmax(extras["teacher_logits"], dim=1) * F.log_softmax(outputs[-1], dim=1)).sum(1).mean()
    return ce + soft + _kl(extras["teacher_features"], hidden["features"])


def _extras(loss: dict, n: int, rng: np.random.Generator, feature_dim: int) -> dict[str, np.ndarray]:
    extras = {}
    if loss["kind"] in ("kd", "recipfl_kt"):
        extras["teacher_logits"] = rng.standard_normal((n, CLASSES)).astype(np.float32) * 3
    if loss["kind"] == "recipfl_kt":
        extras["teacher_features"] = rng.standard_normal((n, feature_dim)).astype(np.float32)
    return extras


def _torch_train(model: nn.Module, loss: dict, x: np.ndarray, y: np.ndarray, extras: dict,
                 recipe: Recipe) -> dict[str, np.ndarray]:
    """torch's run of what OrtTrainingRuntime.train does (same batches, same optimizer)."""
    model.train()
    params = list(model.parameters())
    opt = (torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
           if recipe.optimizer == "adam" else
           torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay))
    order = np.random.default_rng(recipe.seed).permutation(len(y))
    for start in range(0, len(y), recipe.batch_size):
        idx = order[start:start + recipe.batch_size]
        batch_extras = {k: torch.from_numpy(v[idx]) for k, v in extras.items()}
        value = _reference_loss(loss, model, torch.from_numpy(x[idx]), torch.from_numpy(y[idx]), batch_extras)
        opt.zero_grad()
        value.backward()
        opt.step()
    return state_numpy(model)


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    """Export every case, run them all in one ORT worker; returns name -> (inputs, outputs)."""
    job_dir = tmp_path_factory.mktemp("ort-parity")
    digits = load_dataset("digits", seed=0)
    rng = np.random.default_rng(0)
    x, y = digits.x_train[:12], digits.y_train[:12].astype(np.int64)
    tx, ty = digits.x_train[12:12 + TRAIN_SAMPLES], digits.y_train[12:12 + TRAIN_SAMPLES].astype(np.int64)
    pending, cases, inputs = [], [], {}
    for name, (factory, loss) in CASES.items():
        made = factory()
        model = _torch_model(factory)
        pending.append(onnx_export.prepare_ort_program(model, loss, SHAPE, CLASSES))
        feature_dim = model.layers[-1].in_features
        data = {"x": x, "y": y, "tx": tx, "ty": ty, **{f"w:{k}": v for k, v in state_numpy(model).items()}}
        extras = _extras(loss, len(y), rng, feature_dim)
        train_extras = _extras(loss, len(ty), rng, feature_dim)
        data |= {f"e:{k}": v for k, v in extras.items()} | {f"te:{k}": v for k, v in train_extras.items()}
        np.savez(job_dir / f"{name}.npz", **data)
        cases.append({"name": name, "program": f"{name}.ort", "data": f"{name}.npz",
                      "recipes": [r.to_dict() for r in RECIPES]})
        inputs[name] = (made, model, loss, data, extras, train_extras)
    for case, blob in zip(cases, onnx_export.build_ort_programs(pending), strict=True):
        (job_dir / case["program"]).write_bytes(blob)
    (job_dir / "job.json").write_text(json.dumps({"cases": cases}))
    run_ort(["tests/ort_worker.py", str(job_dir)], timeout_s=120)
    return {name: (inputs[name], dict(np.load(job_dir / f"{name}.out.npz"))) for name in CASES}


def _fresh(made, model: nn.Module, weights: dict[str, np.ndarray]) -> nn.Module:
    twin = build_model(made) if isinstance(made, dict) else __import__("copy").deepcopy(model)
    load_numpy(twin, weights)
    return twin


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_match_torch(parity, name):
    (made, model, loss, data, extras, _), ort = parity[name]
    weights = {k[2:]: data[k] for k in data if k.startswith("w:")}
    net = _fresh(made, model, weights).train()
    value = _reference_loss(loss, net, torch.from_numpy(data["x"]), torch.from_numpy(data["y"]),
                            {k: torch.from_numpy(v) for k, v in extras.items()})
    value.backward()
    loss_torch = float(value.detach())
    assert abs(loss_torch - float(ort["loss"])) <= 1e-5, (loss_torch, float(ort["loss"]))
    grads = dict(net.named_parameters())
    assert {k[2:] for k in ort if k.startswith("g:")} == set(grads)
    for pname, param in grads.items():
        scale = max(1.0, float(param.grad.abs().max()))
        diff = float(np.abs(param.grad.numpy() - ort[f"g:{pname}"]).max())
        assert diff <= 1e-5 * scale, (pname, diff, scale)
    after_step = state_numpy(net)  # train-mode forward moved the BatchNorm running statistics
    for wname, value_torch in after_step.items():
        diff = float(np.abs(value_torch - ort[f"s:{wname}"]).max())
        assert diff <= 1e-5 * max(1.0, float(np.abs(value_torch).max())), (wname, diff)


@pytest.mark.parametrize("name", list(CASES))
def test_eval_outputs_match_torch(parity, name):
    (made, model, _, data, _, _), ort = parity[name]
    net = _fresh(made, model, {k[2:]: data[k] for k in data if k.startswith("w:")}).eval()
    with torch.no_grad():
        outputs = net(torch.from_numpy(data["x"]))
    assert len([k for k in ort if k.startswith("eval:")]) == len(outputs)
    for i, out in enumerate(outputs):
        assert float(np.abs(out.numpy() - ort[f"eval:{i}"]).max()) <= 1e-4


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("recipe_index", range(len(RECIPES)))
def test_five_optimizer_steps_match_torch(parity, name, recipe_index):
    (made, model, loss, data, _, train_extras), ort = parity[name]
    start = {k[2:]: data[k] for k in data if k.startswith("w:")}
    expected = _torch_train(_fresh(made, model, start), loss, data["tx"], data["ty"], train_extras,
                            RECIPES[recipe_index])
    moved = max(float(np.abs(expected[k] - start[k]).max()) for k in start)
    assert moved > 1e-3  # the five steps really changed the weights
    for wname, value in expected.items():
        diff = float(np.abs(value - ort[f"r{recipe_index}:w:{wname}"]).max())
        assert diff <= 1e-4, (wname, diff)
