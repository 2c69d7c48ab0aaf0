"""DepthFL's mutual self-distillation loss (``depthfl_sd``) and the method's use of it.

The maths on synthetic logits against values computed here with numpy; the recipes DepthFL
hands out; the ORT export's refusal. Gradient parity on the ExecuTorch and native runtimes
is in test_export_parity.py / test_native_runtime.py (case ``two_exit-depthfl_sd``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.losses import Loss, mutual_distillation
from fedcore.recipe import Recipe
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.exit.depthfl import DepthFL
from server_toolkit.models.zoo import model_spec

LOGITS = [np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]),
          np.array([[0.0, 1.0, 0.0], [1.0, -1.0, 2.0]]),
          np.array([[1.0, 1.0, 1.0], [-2.0, 0.0, 1.0]])]
LABELS = np.array([0, 2])


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _expected(t: float, w: float) -> float:
    """CE summed over the outputs + w * T^2 / (n - 1) * sum over i != j of mean KL(p_j || p_i)."""
    n = len(LOGITS)
    ce = sum(-_log_softmax(z)[np.arange(2), LABELS].mean() for z in LOGITS)
    kl = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                log_pi, log_pj = _log_softmax(LOGITS[i] / t), _log_softmax(LOGITS[j] / t)
                kl += (np.exp(log_pj) * (log_pj - log_pi)).sum(axis=1).mean()
    return ce + w * t * t / (n - 1) * kl


@pytest.mark.parametrize("t, w", [(1.0, 1.0), (2.0, 0.3)])
def test_the_loss_is_the_ce_sum_plus_the_weighted_mean_of_every_pairs_kl(t, w):
    outputs = tuple(torch.tensor(z, dtype=torch.float32) for z in LOGITS)
    loss = Loss.from_dict({"kind": "depthfl_sd", "temperature": t, "alpha": w})
    value = loss(outputs, torch.zeros(2, 1), torch.tensor(LABELS), torch.ones(2), {})
    assert float(value) == pytest.approx(_expected(t, w), rel=1e-5)
    assert _expected(t, w) > _expected(t, 0.0) + 0.1  # the distillation term is not negligible here


def test_the_teacher_side_gets_no_gradient():
    """With two outputs at T = 1, d/d(o_a) of KL(p_b detached || p_a) is (p_a - p_b) / B;
    without the detach each output would get a second term from being the other's teacher."""
    a = torch.tensor(LOGITS[0], dtype=torch.float32, requires_grad=True)
    b = torch.tensor(LOGITS[1], dtype=torch.float32, requires_grad=True)
    mutual_distillation((a, b), torch.ones(2), 1.0).backward()
    p_a, p_b = (np.exp(_log_softmax(z)) for z in LOGITS[:2])
    np.testing.assert_allclose(a.grad.numpy(), (p_a - p_b) / 2, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), (p_b - p_a) / 2, atol=1e-6)


def test_a_single_output_is_trained_on_plain_cross_entropy():
    out = (torch.tensor(LOGITS[0], dtype=torch.float32),)
    args = (out, torch.zeros(2, 1), torch.tensor(LABELS), torch.ones(2), {})
    sd, ce = Loss.from_dict({"kind": "depthfl_sd"})(*args), Loss.from_dict({"kind": "ce"})(*args)
    assert float(sd) == pytest.approx(float(ce))


@pytest.mark.parametrize("bad, message", [
    ({"kind": "depthfl_sd", "temperature": 0}, "temperature > 0"),
    ({"kind": "depthfl_sd", "alpha": 1.5}, "alpha <= 1"),
    ({"kind": "depthfl_sd", "features": 3}, "unknown keys ['features']"),
])
def test_a_bad_self_distillation_loss_is_refused_with_its_reason(bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Loss.from_dict(bad)


def test_the_recipe_carries_the_loss_and_its_parameters():
    recipe = Recipe(loss="depthfl_sd", temperature=2.0, alpha=0.5)
    assert Recipe.from_dict(recipe.to_dict()) == recipe and not recipe.needs_teacher
    assert Loss.from_dict(recipe.loss_dict()) == Loss("depthfl_sd", 2.0, 0.5)


def test_the_ort_export_refuses_self_distillation_in_one_line():
    from export.onnx import prepare_ort_program

    spec = model_spec("lenet5_multi_exit", (1, 8, 8), 5)
    with pytest.raises(ValueError, match="cannot export loss 'depthfl_sd'") as caught:
        prepare_ort_program(spec, {"kind": "depthfl_sd"})
    assert "\n" not in str(caught.value)


def _recipes(**options) -> dict[str, Recipe]:
    spec = model_spec("vgg_multi_exit", (1, 8, 8), 10, channels=(4, 8, 8), exits_after=(1, 2))
    method = DepthFL(spec, Recipe(), **options)
    devices = [DeviceInfo(f"d{t}", 10, str(t)) for t in (1, 2, 3)]
    weights = method.initial_weights(0)
    return {i.device_id: i.recipe for i in method.configure_train(1, weights, devices)}


def test_depthfl_distils_on_devices_with_several_exits_and_not_with_one():
    recipes = _recipes(sd_temperature=2.0, sd_weight=0.5)
    assert recipes["d1"].loss == "ce"
    assert [(recipes[d].loss, recipes[d].temperature, recipes[d].alpha) for d in ("d2", "d3")] == [
        ("depthfl_sd", 2.0, 0.5)] * 2


def test_self_distillation_off_trains_every_tier_on_the_ce_sum():
    assert {r.loss for r in _recipes(self_distillation=False).values()} == {"ce"}


def test_a_zero_temperature_is_refused_when_the_method_is_built():
    with pytest.raises(ValueError, match="sd_temperature > 0"):
        _recipes(sd_temperature=0.0)
