"""The ``recipfl`` method: what devices get, and the server's VJP update (synthetic data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, load_numpy, state_numpy
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.recipfl.graph_hypernet import GraphHypernet
from server_toolkit.methods.recipfl.op_graph import extract_graph, pooled_weights
from server_toolkit.models.zoo import lenet5, small_cnn
from server_toolkit.reconstruct.hypernet_step import hypernet_step

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE, K = (1, 8, 8), 10
STRONG, WEAK, OTHER = (DeviceInfo("s0", 200, "strong"), DeviceInfo("w0", 40, "weak"),
                       DeviceInfo("w1", 40, "weak"))


def make(**options):
    options = {"small_model": "width:0.3", "hidden": 16, "decoder_hidden": 32, **options}
    method = method_class("recipfl")(lenet5(SHAPE, K), Recipe(epochs=1), **options)
    return method, method.initial_weights(0)


def test_weak_devices_get_their_small_model_and_strong_ones_a_trainable_teacher():
    method, weights = make()
    weak, strong = method.configure_train(1, weights, [WEAK, STRONG])
    for instruction, spec in ((weak, method.fleet.small), (strong, method.fleet.small),
                              (strong.models["teacher"], method.fleet.large)):
        assert instruction.spec == spec
        model = build_model(spec)
        assert {k: v.shape for k, v in instruction.weights.items()} == \
            {k: tuple(p.shape) for k, p in model.named_parameters()}
        load_numpy(model, instruction.weights)  # loads: exactly the model's tensors
    assert weak.teacher is None and weak.recipe.loss == "ce" and weak.returns == ("model",)
    # the strong device trains the large model first (CE), then the small one from it; both come back
    assert [s.model for s in strong.plan().steps] == ["teacher", "model"]
    assert strong.returns == ("model", "teacher")
    assert strong.steps_before[0].recipe.loss == "ce" and strong.recipe.loss == "recipfl_kt"
    _, strong_without_kt = make(kt=False)[0].configure_train(1, weights, [WEAK, STRONG])
    assert strong_without_kt.recipe.loss == "ce" and strong_without_kt.returns == ("model", "teacher")


def test_descriptors_personalise_the_generated_weights():
    method, weights = make(label_counts={"w0": [50] + [0] * (K - 1), "w1": [0] * (K - 1) + [50]})
    a, b = method.configure_train(1, weights, [WEAK, OTHER])
    assert not np.allclose(a.weights["layers.0.weight"], b.weights["layers.0.weight"])
    method.set_label_counts("w1", [np.nan, 1])  # bad input is ignored
    method.set_label_counts("w1", [1] * (K + 1))
    assert method.descriptor("w1")[-1] == 1.0
    method.set_label_counts("w1", [1, 3])  # short histograms (labels above 1 absent) are padded
    assert np.allclose(method.descriptor("w1")[:3], [0.25, 0.75, 0])


def _shifted(weights, shift):
    return {k: v + shift[k] for k, v in weights.items()}


@pytest.mark.parametrize("server_step", ["client", "round"])
def test_aggregate_moves_the_generated_weights_toward_the_trained_ones(server_step):
    method, weights = make(hn_lr=1e-4, server_step=server_step)
    rng = np.random.default_rng(0)
    weak, strong = method.configure_train(1, weights, [WEAK, STRONG])
    # one target per architecture (both small models were generated from the same inputs)
    shift = {model: {k: 0.05 * rng.standard_normal(v.shape).astype(np.float32) for k, v in sent.items()}
             for model, sent in (("small", weak.weights), ("large", strong.models["teacher"].weights))}
    teacher = _shifted(strong.models["teacher"].weights, shift["large"])
    counts = {"label_counts": [4] * K}
    updates = [ClientUpdate("w0", 40, _shifted(weak.weights, shift["small"]), counts, weak),
               ClientUpdate("s0", 200, _shifted(strong.weights, shift["small"]), {}, strong,
                            {"teacher": teacher})]
    assert not method.pooled  # nothing returned yet: generation read the initial weights, uniform labels
    strong_student, strong_teacher = updates[1].weights, updates[1].others["teacher"]
    targets = [("small", updates[0].weights), ("small", strong_student), ("large", strong_teacher)]

    def gaps(ghn_weights):
        """Squared distance generated - trained per returned model, with the inputs it was sent with."""
        method._load(ghn_weights)
        with torch.no_grad():
            fresh = {model: method.hypernet.generate(method.graphs[model], method.initial_pooled[model],
                                                     np.full(K, 1 / K, np.float32))
                     for model in ("small", "large")}
        return [sum(float(((fresh[model][k].numpy() - v) ** 2).sum()) for k, v in target.items())
                for model, target in targets]

    start = gaps(weights)
    new = method.aggregate_train(1, weights, updates)
    after = gaps(new)
    assert all(a < b for a, b in zip(after, start, strict=True)), (start, after)
    row = method.aggregate_evaluate(1, updates)
    assert row["hn_models"] == 3 and row["hn_gap_rms"] > 0
    assert set(method.pooled["s0"]) == {"small", "large"} and set(method.pooled["w0"]) == {"small"}
    assert np.allclose(method.descriptor("w0"), 1 / K)


def test_the_printed_sign_moves_the_generated_weights_away():
    spec = small_cnn(SHAPE, K, width=4)
    graph = extract_graph(spec)
    pooled = pooled_weights(graph, state_numpy(build_model(spec, seed=0)))
    rng = np.random.default_rng(1)
    distances = {}
    for sign in (1.0, -1.0):  # +1: grad_outputs = generated - trained; -1: Eq. 4 as printed
        torch.manual_seed(0)
        hn = GraphHypernet([graph], K, hidden=16, decoder_hidden=16)
        optimizer = torch.optim.SGD(hn.parameters(), lr=1e-3)
        generated = torch.cat([t.reshape(-1) for t in hn.generate(graph, pooled, np.full(K, 0.1)).values()])
        noise = torch.from_numpy(rng.standard_normal(generated.shape).astype(np.float32))
        trained = generated.detach() + 0.1 * noise
        hypernet_step([generated], [trained], list(hn.parameters()), optimizer, weight=sign)
        again = torch.cat([t.reshape(-1) for t in hn.generate(graph, pooled, np.full(K, 0.1)).values()])
        distances[sign] = (float((generated.detach() - trained).norm()),
                           float((again.detach() - trained).norm()))
    assert distances[1.0][1] < distances[1.0][0]
    assert distances[-1.0][1] > distances[-1.0][0]


def test_state_survives_a_json_round_trip_and_a_foreign_update_is_refused():
    method, weights = make()
    (weak,) = method.configure_train(1, weights, [WEAK])
    update = ClientUpdate("w0", 40, weak.weights, {"label_counts": [1, 2, 3]}, weak)
    method.aggregate_train(1, weights, [update])
    restored, _ = make()
    restored.load_state_dict(json.loads(json.dumps(method.state_dict())))
    assert np.allclose(restored.descriptor("w0"), method.descriptor("w0"))
    assert all(np.allclose(a, b) for a, b in zip(restored.pooled["w0"]["small"], method.pooled["w0"]["small"],
                                                  strict=True))
    wrong = {k: np.zeros((3, 3), np.float32) for k in weak.weights}
    with pytest.raises(ValueError, match="neither"):
        method.aggregate_train(2, weights, [ClientUpdate("w0", 40, wrong, {}, weak)])
    with pytest.raises(ValueError, match="told apart"):
        make(small_model="width:1.0")
    with pytest.raises(ValueError, match="hypernetwork"):
        method.configure_train(2, {"x": np.zeros(1)}, [WEAK])
