"""Exit-split sub-models, multi-exit model helpers and the depth-split baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods import methods
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.exit.classwise_average import classwise_average
from server_toolkit.methods.exit.depthfl import DepthFL
from server_toolkit.methods.exit.fedavg_exit import FedAvgShallowExit
from server_toolkit.models.exit_eval import deepest_exit_accuracy, exit_accuracies
from server_toolkit.models.multi_exit import add_exits, cnn_multi_exit, resnet18_multi_exit
from server_toolkit.models.zoo import small_cnn, vgg_multi_exit
from server_toolkit.reconstruct.present_average import average_present
from server_toolkit.submodels.exit_split import (
    ExitSplit,
    classifier_tensors,
    conv_segments,
    exit_positions,
    name_map,
    num_tiers,
    parse_tier,
    prefix_spec,
)

SPEC = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 16))


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny tensors gain nothing from threads (see tests/conftest.py)."""


def _weights(spec: dict, seed: int = 0) -> dict:
    return state_numpy(build_model(spec, seed=seed))


# ---- planner ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tier", [1, 2, 3])
def test_tier_prefix_has_tier_outputs_and_maps_onto_global_tensors(tier):
    global_weights = _weights(SPEC)
    sub = ExitSplit().plan(SPEC, global_weights, str(tier), round_number=1)
    assert modelspec.num_outputs(sub.spec) == tier
    built = _weights(sub.spec)
    assert set(built) == set(sub.weights) == set(sub.index_map["to_global"])
    for sub_name, global_name in sub.index_map["to_global"].items():
        assert built[sub_name].shape == global_weights[global_name].shape
        assert sub.weights[sub_name] is global_weights[global_name]
    assert sub.index_map["tier"] == tier
    # the sub-model runs and its last output is the tier-th exit of the global model
    model, full = build_model(sub.spec), build_model(SPEC)
    from fedcore.torch_model import load_numpy

    load_numpy(model, sub.weights)
    load_numpy(full, global_weights)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(model.eval()(x)[-1], full.eval()(x)[tier - 1], atol=1e-6)


def test_deepest_tier_and_none_train_the_whole_model():
    global_weights = _weights(SPEC)
    for tier in (None, "3"):
        sub = ExitSplit().plan(SPEC, global_weights, tier, round_number=4)
        assert sub.spec == SPEC and set(sub.weights) == set(global_weights)


def test_bad_tiers_are_refused():
    for tier in ("0", "4", "big", "1.5"):
        with pytest.raises(ValueError, match="exit count"):
            parse_tier(tier, SPEC)


def test_head_layers_are_renamed_into_the_trunk():
    names = list(_weights(SPEC))
    first_exit = exit_positions(SPEC)[0]
    mapping = name_map(SPEC, 1, names)
    linear = len(SPEC["layers"][first_exit]["head"]) - 1
    assert mapping[f"layers.{first_exit + linear}.weight"] == f"layers.{first_exit}.head.{linear}.weight"
    assert not any(g.startswith(f"layers.{first_exit + 1}.") for g in mapping.values())


def test_vgg_segments_are_blocks_1_2_then_3_then_4():
    segments = conv_segments(SPEC)
    assert [len(s) for s in segments] == [4, 2, 2]
    assert [shape[0] for _, shape in segments[1]] == [8, 8]
    assert [shape[0] for _, shape in segments[2]] == [16, 16]
    weights = _weights(SPEC)
    for segment in segments:
        for name, shape in segment:
            assert weights[name].shape == shape


# ---- multi-exit models -----------------------------------------------------------------------

def test_add_exits_places_exits_at_depth_thirds():
    spec = resnet18_multi_exit((3, 16, 16), 5, widths=(4, 8, 8, 8))
    assert modelspec.num_outputs(spec) == num_tiers(spec) == 3
    body_convs = [sum(1 for n, s in seg if ".shortcut." not in n) for seg in conv_segments(spec)]
    assert sum(body_convs) == 17  # ResNet-18: stem + 8 blocks x 2
    assert body_convs[0] == 5 and body_convs[0] + body_convs[1] == 11  # 17/3 -> 5, 34/3 -> 11
    outputs = build_model(spec, seed=0).eval()(torch.randn(2, 3, 16, 16))
    assert len(outputs) == 3 and all(o.shape == (2, 5) for o in outputs)


def test_ten_exit_cnn_has_an_exit_after_every_conv():
    spec = cnn_multi_exit((1, 28, 28), 10, num_exits=10, width=4)
    assert modelspec.num_outputs(spec) == 10
    assert [len(s) for s in conv_segments(spec)] == [1] * 10
    outputs = build_model(spec, seed=0).eval()(torch.randn(2, 1, 28, 28))
    assert len(outputs) == 10


def test_add_exits_refuses_more_exits_than_places():
    plain = small_cnn((1, 8, 8), 10)  # two convs
    assert modelspec.num_outputs(add_exits(plain, 2)) == 2
    with pytest.raises(ValueError, match="cannot place"):
        add_exits(plain, 4)
    with pytest.raises(ValueError, match="without exits"):
        add_exits(SPEC, 2)


# ---- aggregation of present layers -----------------------------------------------------------

def _update(method, global_weights, device_id, tier, samples, shift):
    instruction = method.configure_train(1, global_weights, [DeviceInfo(device_id, samples, str(tier))])[0]
    trained = {k: v + shift for k, v in instruction.weights.items()}
    return ClientUpdate(device_id, samples, trained, {}, instruction)


def test_depthfl_averages_each_tensor_over_the_clients_that_trained_it():
    method = DepthFL(SPEC, Recipe())
    global_weights = _weights(SPEC)
    updates = [_update(method, global_weights, dev, tier, n, shift)
               for dev, tier, n, shift in [("a", 1, 10, 1.0), ("b", 2, 30, 2.0), ("c", 3, 60, 4.0)]]
    new = method.aggregate_train(1, global_weights, updates)
    seg = conv_segments(SPEC)
    first, second, third = seg[0][0][0], seg[1][0][0], seg[2][0][0]
    np.testing.assert_allclose(new[first], global_weights[first] + (10 + 30 * 2 + 60 * 4) / 100, rtol=1e-6)
    np.testing.assert_allclose(new[second], global_weights[second] + (30 * 2 + 60 * 4) / 90, rtol=1e-6)
    np.testing.assert_allclose(new[third], global_weights[third] + 4.0, rtol=1e-6)
    # only tier 3 trained the final classifier; exit 1's head was trained by everyone
    final = sorted(k for k in global_weights if k.startswith(f"layers.{len(SPEC['layers']) - 1}."))
    np.testing.assert_allclose(new[final[0]], global_weights[final[0]] + 4.0, rtol=1e-6)
    # the deep layers are untouched when no deep client took part
    shallow_only = method.aggregate_train(1, global_weights, updates[:1])
    assert np.array_equal(shallow_only[third], global_weights[third])
    assert not np.array_equal(shallow_only[first], global_weights[first])


def test_classifier_tensors_are_every_outputs_last_linear_layer():
    last = len(SPEC["layers"]) - 1
    exits = exit_positions(SPEC)
    assert classifier_tensors(SPEC) == [
        f"layers.{exits[0]}.head.2.weight", f"layers.{exits[0]}.head.2.bias",
        f"layers.{exits[1]}.head.2.weight", f"layers.{exits[1]}.head.2.bias",
        f"layers.{last}.weight", f"layers.{last}.bias"]
    for name in classifier_tensors(SPEC):
        assert _weights(SPEC)[name].shape[0] == 10


def test_classwise_average_weights_each_row_by_the_clients_samples_of_its_class():
    g = {"w": np.zeros((3, 2), np.float32), "b": np.full(3, 9.0, np.float32)}
    a = ({"w": np.ones((3, 2), np.float32), "b": np.ones(3, np.float32)}, np.array([3.0, 0.0, 0.0]))
    b = ({"w": np.full((3, 2), 5.0, np.float32)}, np.array([1.0, 2.0, 0.0]))
    out = classwise_average(g, [a, b], ["w", "b"])
    np.testing.assert_allclose(out["w"], [[2.0, 2.0], [5.0, 5.0], [0.0, 0.0]])  # class 2: nobody, kept
    np.testing.assert_allclose(out["b"], [1.0, 9.0, 9.0])  # only a holds b, and has class 0 only
    assert out["w"].dtype == np.float32
    assert classwise_average(g, [b], ["b"]) == {}  # nobody holds b
    with pytest.raises(ValueError, match="class counts"):
        classwise_average(g, [({"b": np.ones(3, np.float32)}, np.ones(2))], ["b"])


def test_depthfl_averages_classifier_rows_per_class_from_reported_label_counts():
    global_weights = _weights(SPEC)
    final_w = classifier_tensors(SPEC)[-2]
    per_class = DepthFL(SPEC, Recipe())
    plain = DepthFL(SPEC, Recipe(), classwise_heads=False)
    updates = []
    for dev, counts, shift in [("a", [4] + [0] * 9, 1.0), ("b", [0, 6] + [0] * 8, 3.0)]:
        update = _update(per_class, global_weights, dev, 3, sum(counts), shift)
        updates.append(ClientUpdate(dev, update.num_samples, update.weights, {"label_counts": counts},
                                    update.instruction))
    new = per_class.aggregate_train(1, global_weights, updates)
    old = plain.aggregate_train(1, global_weights, updates)
    np.testing.assert_allclose(new[final_w][0], global_weights[final_w][0] + 1.0, rtol=1e-6)  # a's class
    np.testing.assert_allclose(new[final_w][1], global_weights[final_w][1] + 3.0, rtol=1e-6)  # b's class
    np.testing.assert_array_equal(new[final_w][2:], global_weights[final_w][2:])  # nobody's classes
    np.testing.assert_allclose(old[final_w], global_weights[final_w] + (4 + 18) / 10, rtol=1e-6)
    conv = conv_segments(SPEC)[2][0][0]
    np.testing.assert_array_equal(new[conv], old[conv])  # everything else: the plain average


def test_average_present_checks_its_input():
    g = {"w": np.zeros(3, np.float32), "n": np.zeros(2, np.int64)}
    out = average_present(g, [({"w": np.ones(3, np.float32)}, 1.0),
                              ({"w": np.full(3, 3.0, np.float32)}, 3.0)])
    np.testing.assert_allclose(out["w"], 2.5)
    assert out["w"].dtype == np.float32 and out["n"] is g["n"]
    with pytest.raises(KeyError):
        average_present(g, [({"x": np.ones(3)}, 1.0)])
    with pytest.raises(ValueError):
        average_present(g, [({"w": np.ones(4)}, 1.0)])


def test_exit_split_methods_are_discovered_and_hand_out_adam():
    available = methods()
    for name in ("depthfl", "hypemefed", "fedavg-s-exit", "fedavg-l-exit"):
        assert name in available
    method = available["hypemefed"](SPEC, Recipe(epochs=3, lr=0.05, optimizer="sgd"))
    instruction = method.configure_train(1, _weights(SPEC), [DeviceInfo("d", 5, "2")])[0]
    assert instruction.recipe.optimizer == "adam" and instruction.recipe.lr == 5e-4
    assert instruction.recipe.batch_size == 16 and instruction.recipe.epochs == 3
    own = available["depthfl"](SPEC, Recipe(lr=0.05), user_recipe=True)
    assert own.configure_train(1, _weights(SPEC), [DeviceInfo("d", 5, "1")])[0].recipe.optimizer == "sgd"


def test_fedavg_s_trains_the_tier_one_prefix_from_the_full_models_initial_weights():
    method = FedAvgShallowExit(SPEC, Recipe())
    assert method.global_spec == prefix_spec(SPEC, 1)
    start, full = method.initial_weights(7), _weights(SPEC, seed=7)
    for sub, g in name_map(SPEC, 1, list(full)).items():
        assert np.array_equal(start[sub], full[g])
    instruction = method.configure_train(1, start, [DeviceInfo("d", 5, "3")])[0]
    assert instruction.spec == prefix_spec(SPEC, 1)


def test_exit_accuracies_score_every_output():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 20)
    weights = _weights(SPEC)
    accs = exit_accuracies(SPEC, weights, x, y)
    assert len(accs) == 3 and all(0 <= a <= 1 for a in accs)
    model = build_model(SPEC)
    from fedcore.torch_model import load_numpy

    load_numpy(model, weights)
    with torch.no_grad():
        outs = model.eval()(torch.from_numpy(x))
    assert accs == [float((o.argmax(1).numpy() == y).mean()) for o in outs]
    mean_deepest = deepest_exit_accuracy(SPEC, weights, [(1, x, y), (3, x, y)])
    assert mean_deepest == pytest.approx((accs[0] + accs[2]) / 2)
