"""MH-pFedHNGD: the two stages, the global model's head, the teacher, the weighted step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.hypernet.mh_pfedhngd import MHPFedHNGD
from server_toolkit.models.zoo import model_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = model_spec("lenet", (1, 8, 8), 10)
DEVICES = [DeviceInfo("a", 30, "vgg8"), DeviceInfo("b", 10, "mlp"), DeviceInfo("c", 60, "lenet")]


def trained_copies(instructions, shift):
    return [ClientUpdate(i.device_id, d.num_samples,
                         {k: v + shift[i.device_id] for k, v in i.weights.items()}, {}, i)
            for i, d in zip(instructions, DEVICES, strict=True)]


def test_stage_one_sends_the_smallest_architecture_with_its_head_and_makes_one_weighted_step():
    m = MHPFedHNGD(SPEC, Recipe())
    weights = m.initial_weights(0)
    stage_one = m.configure_train(1, weights, DEVICES)
    assert {i.spec["layers"][1]["op"] for i in stage_one} == {"linear"}  # mlp: flatten, linear, ...
    assert all(i.context == {"architecture": "mlp", "stage": 1} and i.teacher is None for i in stage_one)
    assert all(i.recipe.loss == "ce" for i in stage_one)
    assert m.global_client.head == m.clients["b"].head == "tau6"  # K_g = min K_i: the smallest client's head
    sent = m.teacher_weights
    assert all(i.weights is sent for i in stage_one)

    shift = {"a": 0.3, "b": -0.1, "c": 0.0}
    arch = m.architecture_named("mlp")
    target = arch.flatten(sent) + sum(shift[d.device_id] * d.num_samples / 100 for d in DEVICES)
    before = np.linalg.norm(arch.flatten(sent) - target)
    generations = []
    step_toward = m.step_toward

    def recording_step(client, trained, **kwargs):
        generations.append((client, trained))
        step_toward(client, trained, **kwargs)

    m.step_toward = recording_step
    m.aggregate_train(1, weights, trained_copies(stage_one, shift))
    assert len(generations) == 1 and generations[0][0] is m.global_client  # one step, on the global model
    np.testing.assert_allclose(generations[0][1], target, rtol=1e-5, atol=1e-6)  # the sample-weighted mean
    after = np.linalg.norm(arch.flatten(m.generated_weights(m.global_client)) - target)
    assert after < before
    assert m.last_round["stage"] == 1


def test_stage_two_distils_from_the_global_model_sent_at_stage_one():
    m = MHPFedHNGD(SPEC, Recipe(), kd_alpha=0.2, kd_temperature=5)
    weights = m.initial_weights(0)
    stage_one = m.configure_train(1, weights, DEVICES)
    sent = {k: v.copy() for k, v in m.teacher_weights.items()}
    weights = m.aggregate_train(1, weights, trained_copies(stage_one, {"a": 0.1, "b": 0.1, "c": 0.1}))
    regenerated = m.generated_weights(m.global_client)
    assert any(not np.array_equal(regenerated[k], sent[k]) for k in sent)  # the update moved w_g...
    stage_two = m.configure_train(2, weights, DEVICES)
    for i in stage_two:
        assert i.teacher == "teacher" and not i.steps_before and i.returns == ("model",)  # frozen
        # ...but the teacher is w_g as it was sent
        assert all(np.array_equal(i.models["teacher"].weights[k], sent[k]) for k in sent)
        assert i.recipe.loss == "kd" and i.recipe.alpha == 0.2 and i.recipe.temperature == 5
        assert i.context["stage"] == 2 and i.spec == m.architecture_named(m.clients[i.device_id].tier).spec
    before = {d: m.generate(m.clients[d]).detach().numpy().copy() for d in "abc"}
    m.aggregate_train(2, weights, trained_copies(stage_two, {"a": 0.1, "b": 0.1, "c": 0.1}))
    assert m.last_round["stage"] == 2
    assert all(not np.array_equal(m.generate(m.clients[d]).detach().numpy(), before[d]) for d in "abc")


def test_without_distillation_stage_two_has_no_teacher():
    m = MHPFedHNGD(SPEC, Recipe(), distill=False, global_arch="lenet")
    weights = m.initial_weights(0)
    m.configure_train(1, weights, DEVICES)
    assert m.global_client.tier == "lenet" and m.global_client.head == m.clients["c"].head
    assert all(i.teacher is None and i.recipe.loss == "ce" for i in m.configure_train(2, weights, DEVICES))


def test_resume_restores_the_global_model_and_the_teacher():
    m = MHPFedHNGD(SPEC, Recipe())
    weights = m.initial_weights(0)
    stage_one = m.configure_train(1, weights, DEVICES)
    saved = m.aggregate_train(1, weights, trained_copies(stage_one, {"a": 0.1, "b": 0.2, "c": 0.3}))
    assert any(k.startswith("global_model/") for k in saved)
    restored = MHPFedHNGD(SPEC, Recipe())
    restored.load_state_dict(json.loads(json.dumps(m.state_dict())))
    copied = {k: v.copy() for k, v in saved.items()}
    for a, b in zip(m.configure_train(2, saved, DEVICES), restored.configure_train(2, copied, DEVICES),
                    strict=True):
        assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
        assert all(np.array_equal(a.models["teacher"].weights[k], b.models["teacher"].weights[k])
                   for k in a.models["teacher"].weights)
