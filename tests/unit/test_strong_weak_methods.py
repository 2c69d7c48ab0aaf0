"""Resource-skew baselines: roles, small architectures, AllSmall and ExclusiveFL (synthetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.exclusivefl import without_prefix
from server_toolkit.methods.strong_weak import evaluate_spec, strong_weak
from server_toolkit.models.zoo import lenet5, resnet_small

SHAPE, K = (1, 8, 8), 10
SPEC = lenet5(SHAPE, K)
DEVICES = [DeviceInfo("s0", 100, "strong"), DeviceInfo("w0", 20, "weak"), DeviceInfo("w1", 30, None),
           DeviceInfo("p0", 40, None, profile={"tier": "strong"})]


def test_roles_and_small_architectures():
    fleet = strong_weak(SPEC, "width:0.25", "strong,big")
    assert [fleet.role(d) for d in DEVICES] == ["strong", "weak", "weak", "strong"]
    assert fleet.is_strong(DeviceInfo("b", 1, "big"))
    small = [(layer["in"], layer["out"]) for layer in fleet.small["layers"] if "out" in layer]
    assert small[0] == (1, 2) and small[-1][1] == K  # input and classes never cut
    assert strong_weak(SPEC, "small_cnn").small["layers"][0]["out"] == 16
    with pytest.raises(ValueError, match="ratio"):
        strong_weak(SPEC, "width:1.5")
    with pytest.raises(ValueError, match="unknown model"):
        strong_weak(SPEC, "no_such_model")


def test_model_of_places_weights_by_shape_even_without_buffers():
    spec = resnet_small(SHAPE, K, widths=(8, 16))
    fleet = strong_weak(spec, "width:0.5")
    large, small = state_numpy(build_model(fleet.large)), state_numpy(build_model(fleet.small))
    assert fleet.model_of(large) == "large" and fleet.model_of(small) == "small"
    params_only = {k: v for k, v in small.items() if "running" not in k}
    assert fleet.model_of(params_only) == "small"
    with pytest.raises(ValueError, match="neither"):
        fleet.model_of({k: v for k, v in params_only.items() if not k.startswith("layers.0.")})


def test_allsmall_trains_the_small_model_everywhere():
    method = method_class("allsmall")(SPEC, Recipe(), small_model="width:0.25")
    weights = method.initial_weights(0)
    instructions = method.configure_train(1, weights, DEVICES)
    assert all(i.spec == method.global_spec for i in instructions)
    assert weights["layers.0.weight"].shape == (2, 1, 5, 5)


def test_exclusivefl_keeps_two_federations_apart():
    method = method_class("exclusivefl")(SPEC, Recipe(), small_model="width:0.25")
    weights = method.initial_weights(0)
    instructions = {i.device_id: i for i in method.configure_train(1, weights, DEVICES)}
    assert instructions["s0"].spec == SPEC and instructions["p0"].spec == SPEC
    assert instructions["w0"].spec == method.fleet.small
    assert set(instructions["s0"].weights) == set(without_prefix(weights, "large"))

    def update(device_id, value):
        sent = instructions[device_id]
        trained = {k: np.full_like(v, value) for k, v in sent.weights.items()}
        return ClientUpdate(device_id, 10, trained, {}, sent)

    new = method.aggregate_train(1, weights, [update("w0", 1.0), update("w1", 3.0)])
    assert all(np.allclose(v, 2.0) for v in without_prefix(new, "small").values())
    assert all(np.array_equal(new[k], weights[k]) for k in weights if k.startswith("large."))
    new = method.aggregate_train(2, new, [update("s0", 5.0)])
    assert all(np.allclose(v, 5.0) for v in without_prefix(new, "large").values())
    x = np.random.default_rng(0).random((20, *SHAPE), np.float32)
    scores = method.evaluate(weights, x, np.arange(20) % K)
    assert {"accuracy", "accuracy_large", "accuracy_small"} <= set(scores)


def test_bn_calibration_replaces_statistics_left_on_the_devices():
    spec = resnet_small(SHAPE, K, widths=(4, 8))
    model = build_model(spec, seed=0)
    x = np.random.default_rng(0).random((40, *SHAPE), np.float32)
    y = np.arange(40) % K
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        norm.momentum = None  # cumulative: the statistics of exactly these 40 images
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(x))
    calibrated = state_numpy(model)
    wrong = {k: np.full_like(v, 100.0) if "running" in k else v for k, v in calibrated.items()}
    expected = evaluate_spec(spec, calibrated, x, y)
    assert evaluate_spec(spec, wrong, x, y)["loss"] != pytest.approx(expected["loss"])
    recalibrated = evaluate_spec(spec, wrong, x, y, calibrate_bn=True)
    assert recalibrated["loss"] == pytest.approx(expected["loss"], rel=1e-4)
