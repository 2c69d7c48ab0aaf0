"""``accuracy_tier_<tier>`` (``methods/tier_accuracy.py``): one model per tier, or the mean of a
tier's personal models; devices without a tier count as ``default``."""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.tier_accuracy import TierAccuracy, model_accuracy
from server_toolkit.models.zoo import model_spec

DATA = load_dataset("digits", seed=0)
TEST = (DATA.x_test[:100], DATA.y_test[:100])


def test_a_global_model_gives_every_tier_the_accuracy_of_the_global_model():
    spec = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)
    method = method_class("fedavg")(spec, Recipe())
    weights = method.initial_weights(0)
    tiers = TierAccuracy()
    tiers.see([DeviceInfo("a", 10, None), DeviceInfo("b", 10, "fast")])
    out = tiers.evaluate(method, weights, *TEST)
    assert out == {"accuracy_tier_default": method.evaluate(weights, *TEST)["accuracy"],
                   "accuracy_tier_fast": out["accuracy_tier_default"]}


def test_a_width_tier_is_scored_on_its_own_window():
    spec = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)
    method = method_class("heterofl")(spec, Recipe())
    weights = method.initial_weights(0)
    tiers = TierAccuracy()
    tiers.see([DeviceInfo("a", 10, "1.0"), DeviceInfo("b", 10, "0.25")])
    out = tiers.evaluate(method, weights, *TEST)
    small_spec, small = method.deployable(weights, DeviceInfo("b", 10, "0.25"))
    assert sum(v.size for v in small.values()) < sum(v.size for v in weights.values())
    assert out["accuracy_tier_0.25"] == model_accuracy(small_spec, small, *TEST)
    assert out["accuracy_tier_1.0"] == method.evaluate(weights, *TEST)["accuracy"]


class TwoPersonalModels:
    """A stand-in with one model per device: "a" always answers the commonest test class, "b" class 0."""

    per_device_models = True

    def deployable(self, weights, device):
        spec = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)
        params = {k: np.zeros_like(v) for k, v in weights.items()}
        bias = [k for k in params if k.endswith("bias")][-1]
        params[bias][int(np.bincount(TEST[1]).argmax()) if device.device_id == "a" else 0] = 1.0
        return spec, params


def test_a_tier_of_personal_models_scores_the_mean_over_its_devices():
    spec = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)
    weights = method_class("fedavg")(spec, Recipe()).initial_weights(0)
    tiers = TierAccuracy()
    tiers.see([DeviceInfo("a", 10, "t"), DeviceInfo("b", 10, "t")])
    method = TwoPersonalModels()
    one = [model_accuracy(*method.deployable(weights, DeviceInfo(d, 10, "t")), *TEST) for d in "ab"]
    assert tiers.evaluate(method, weights, *TEST) == {"accuracy_tier_t": np.mean(one)}
    assert one[0] != one[1]


def test_a_nested_width_tier_is_scored_on_the_mean_softmax_of_its_window_and_the_narrower_ones():
    import pytest
    import torch

    from fedcore.torch_model import build_model
    from server_toolkit.methods.options import OptionError

    spec = model_spec("small_cnn", DATA.input_shape, DATA.num_classes)
    method = method_class("heterofl")(spec, Recipe(), deploy="nested")
    weights = method.initial_weights(3)
    devices = [DeviceInfo("a", 10, "1.0"), DeviceInfo("b", 10, "0.5"), DeviceInfo("c", 10, "0.25")]
    method.configure_train(1, weights, devices)  # the fleet's ratios: 1.0, 0.5, 0.25
    tiers = TierAccuracy()
    tiers.see(devices)
    out = tiers.evaluate(method, weights, *TEST)
    members = method.deployable_members(weights, devices[0])
    assert [s for s, _ in members] == [method.deployable(weights, DeviceInfo("x", 1, t))[0]
                                       for t in ("1.0", "0.5", "0.25")]
    probs = []
    for member_spec, member in members:
        model = build_model(member_spec).eval()
        model.load_state_dict({k: torch.from_numpy(v) for k, v in member.items()}, strict=False)
        with torch.no_grad():
            logits = model(torch.from_numpy(TEST[0].astype(np.float32)))
            probs.append(torch.softmax(logits[-1] if isinstance(logits, tuple | list) else logits, 1))
    expected = float((torch.stack(probs).mean(0).argmax(1).numpy() == TEST[1]).mean())
    assert out["accuracy_tier_1.0"] == pytest.approx(expected)
    assert out["accuracy_tier_0.25"] == model_accuracy(*method.deployable(weights, devices[2]), *TEST)
    assert len(method.deployable_members(weights, devices[1])) == 2
    with pytest.raises(OptionError, match="deploy takes 'window' or 'nested'"):
        method_class("heterofl")(spec, Recipe(), deploy="all")
