"""Resource-skew baselines: roles, small architectures, AllSmall and ExclusiveFL, and the
strong/weak accuracy every method of the comparison reports (synthetic)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.recipfl.exclusivefl import without_prefix
from server_toolkit.methods.recipfl.strong_weak import evaluate_spec, strong_weak
from server_toolkit.methods.target_accuracy import TargetAccuracy
from server_toolkit.methods.tiers import resolve_tier
from server_toolkit.models.multi_exit import lenet5_multi_exit
from server_toolkit.models.zoo import lenet5, resnet_small

SHAPE, K = (1, 8, 8), 10
SPEC = lenet5(SHAPE, K)
PROFILE = {"tier": "strong"}  # p0: no fleet tier, its profile's (resolved before methods see it)
DEVICES = [DeviceInfo("s0", 100, "strong"), DeviceInfo("w0", 20, "weak"), DeviceInfo("w1", 30, None),
           DeviceInfo("p0", 40, resolve_tier(None, PROFILE), profile=PROFILE)]


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


def _always(label: int, spec: dict) -> dict:
    """Parameters of ``spec`` whose model predicts ``label`` for every input."""
    weights = {k: np.zeros_like(v) for k, v in state_numpy(build_model(spec)).items()}
    weights[f"layers.{len(spec['layers']) - 1}.bias"][label] = 1.0
    return weights


def test_target_accuracy_scores_each_device_on_its_own_labels():
    x = np.random.default_rng(0).random((50, *SHAPE), np.float32)
    y = np.arange(50) % K  # 5 test samples per class
    targets = TargetAccuracy(K)
    devices = [DeviceInfo("s0", 10, "strong"), DeviceInfo("w0", 10, "weak"), DeviceInfo("w1", 10, "weak"),
               DeviceInfo("x0", 10, "other")]
    targets.see(devices, lambda d: d.tier if d.tier in ("strong", "weak") else None)
    assert set(targets.devices) == {"s0", "w0", "w1"}  # a device without a role is not scored
    counts = {"s0": [1] * K, "w0": [9] + [0] * (K - 1), "w1": [0, 5, 5]}
    targets.report([ClientUpdate(d, 10, {}, {"label_counts": c}, None) for d, c in counts.items()])
    constant = _always(0, SPEC)
    scores = targets.evaluate(lambda device, role: (SPEC, constant), x, y)
    # "always 0": 1/10 on the uniform strong device; w0 holds only 0s (1.0), w1 none (0.0)
    assert scores == pytest.approx({"accuracy_strong": 0.1, "accuracy_weak": 0.5})
    again = TargetAccuracy(K)
    again.load(json.loads(json.dumps(targets.state())))
    assert again.evaluate(lambda device, role: (SPEC, constant), x, y) == pytest.approx(scores)


ROLE_TIERS = [DeviceInfo("s0", 100, "strong"), DeviceInfo("w0", 20, "weak"), DeviceInfo("w1", 20, "weak")]
SETUPS = {  # method -> (global spec, options): the comparison's arms as simulate builds them
    "recipfl": (SPEC, {"small_model": "width:0.3", "hidden": 16, "decoder_hidden": 32}),
    "allsmall": (SPEC, {"small_model": "width:0.3"}),
    "exclusivefl": (SPEC, {"small_model": "width:0.3"}),
    "heterofl": (SPEC, {"tier_ratios": {"strong": 1.0, "weak": 0.3}}),
    "depthfl": (lenet5_multi_exit(SHAPE, K), {"tier_exits": {"strong": 2, "weak": 1}, "user_recipe": True}),
}


def _echo(instruction, counts: list[int]) -> ClientUpdate:
    """A device's result that returns what it was sent (and the other models it returns)."""
    others = {name: dict(instruction.models[name].weights) for name in instruction.returns if name != "model"}
    return ClientUpdate(instruction.device_id, 20, dict(instruction.weights), {"label_counts": counts},
                        instruction, others)


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_every_method_of_the_comparison_reports_strong_and_weak_accuracy(name):
    spec, options = SETUPS[name]
    method = method_class(name)(spec, Recipe(epochs=1), **options)
    weights = method.initial_weights(0)
    instructions = method.configure_train(1, weights, ROLE_TIERS)
    small = {i.device_id: sum(v.size for v in i.weights.values()) for i in instructions}
    assert small["w0"] < 0.2 * sum(v.size for v in weights.values()) or name in ("allsmall", "recipfl")
    updates = [_echo(i, [5] * K) for i in instructions]
    weights = method.aggregate_train(1, weights, updates)
    method.aggregate_evaluate(1, updates)
    x = np.random.default_rng(0).random((30, *SHAPE), np.float32)
    scores = method.evaluate(weights, x, np.arange(30) % K)
    assert 0 <= scores["accuracy_strong"] <= 1 and 0 <= scores["accuracy_weak"] <= 1
    assert {d: role for d, (role, _) in method.targets.devices.items()} == \
        {"s0": "strong", "w0": "weak", "w1": "weak"}
    state = json.loads(json.dumps(method.state_dict()))
    again = method_class(name)(spec, Recipe(epochs=1), **options)
    again.load_state_dict(state)
    assert again.targets.devices == method.targets.devices
    assert again.targets.label_counts == method.targets.label_counts


def test_width_and_depth_baselines_score_each_role_on_its_own_model():
    """Weights under which the large model predicts 1 and the weak device's model 0: on
    all-zero labels weak devices must score 1 and strong ones 0."""
    x = np.random.default_rng(0).random((20, *SHAPE), np.float32)
    y = np.zeros(20, np.int64)
    for name, last_hidden, large_head, small_head in (
            ("heterofl", "layers.9", "layers.11", "layers.11"),  # hidden unit 83: not in the 0.3 window
            ("depthfl", None, "layers.12", "layers.6.head.1")):  # the exit's head vs the final one
        spec, options = SETUPS[name]
        method = method_class(name)(spec, Recipe(epochs=1), **options)
        weights = {k: np.zeros_like(v) for k, v in method.initial_weights(0).items()}
        if last_hidden:
            weights[f"{last_hidden}.bias"][83] = 1.0
            weights[f"{large_head}.weight"][1, 83] = 1.0
        else:
            weights[f"{large_head}.bias"][1] = 1.0
        weights[f"{small_head}.bias"][0] = 0.5
        method.configure_train(1, weights, ROLE_TIERS)
        scores = method.evaluate(weights, x, y)
        assert (scores["accuracy_strong"], scores["accuracy_weak"]) == pytest.approx((0.0, 1.0)), name
