"""HeteroFL's ``also_narrowest``: a wide device trains the narrowest window too, in the same
task (``methods/width/nested.py``), and the narrow window is averaged over every device's copy
(``coverage.nested_average``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods import method_class
from server_toolkit.methods.base import MODEL, ClientUpdate, DeviceInfo
from server_toolkit.methods.capability import FEATURES, why_not
from server_toolkit.methods.options import OptionError
from server_toolkit.methods.width.coverage import coverage_average, nested_average
from server_toolkit.methods.width.nested import NARROW
from server_toolkit.models.zoo import model_spec
from server_toolkit.reconstruct.average import weighted_average
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from server_toolkit.submodels.width import extract

SPEC = model_spec("lenet5", (1, 28, 28), 10)
DEVICES = [DeviceInfo("full", 30, tier="1.0"), DeviceInfo("half", 20, tier="0.5"),
           DeviceInfo("tiny", 10, tier="0.125"), DeviceInfo("pte", 40, tier="1.0", runtimes=("executorch",))]


def test_narrow_models_own_their_window_and_the_wide_windows_the_rest() -> None:
    zeros = {"w": np.zeros((4, 4)), "b": np.zeros(4)}
    inner = {"w": (np.arange(2), np.arange(2)), "b": (np.arange(2),)}
    whole = {"w": (np.arange(4), np.arange(4)), "b": (np.arange(4),)}
    narrow = [({"w": np.full((2, 2), 1.0), "b": np.full(2, 1.0)}, inner, 10.0),
              ({"w": np.full((2, 2), 4.0), "b": np.full(2, 4.0)}, inner, 30.0)]
    wide = [({"w": np.full((4, 4), 8.0), "b": np.full(4, 8.0)}, whole, 30.0),
            ({"w": np.full((4, 4), 0.0), "b": np.full(4, 0.0)}, whole, 10.0)]
    owned = nested_average(zeros, narrow, wide)
    assert np.all(owned["w"][:2, :2] == (10 * 1 + 30 * 4) / 40) and np.all(owned["b"][:2] == 3.25)
    assert np.all(owned["w"][2:] == 6.0) and np.all(owned["w"][:, 2:] == 6.0)
    assert np.all(owned["b"][2:] == 6.0)
    mixed = nested_average(zeros, narrow, wide, inner="average")
    assert np.all(mixed["w"][:2, :2] == (10 * 1 + 30 * 4 + 30 * 8) / 80)
    assert all(np.array_equal(mixed[k], coverage_average(zeros, [*narrow, *wide])[k]) for k in zeros)
    # no narrow model this round: the wide windows' mean everywhere they cover
    assert np.all(nested_average(zeros, [], wide)["w"] == 6.0)
    with pytest.raises(ValueError, match="inner must be 'narrow' or 'average'"):
        nested_average(zeros, narrow, wide, inner="both")


def test_a_wide_device_gets_a_two_model_task_and_the_narrowest_one_its_own_model() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125)
    weights = method.initial_weights(0)
    full, half, tiny, pte = method.configure_train(1, weights, DEVICES)
    narrow_plan = method.layout.plan(0.125, {})
    for wide, ratio in ((full, 1.0), (half, 0.5)):
        assert wide.spec == method.layout.plan(ratio, {}).spec and wide.returns == (MODEL, NARROW)
        assert wide.models[NARROW].spec == narrow_plan.spec
        assert all(np.array_equal(wide.models[NARROW].weights[k], v)
                   for k, v in extract(weights, narrow_plan.index_map).items())
        plan = wide.plan()
        assert [s.model for s in plan.steps] == [NARROW, MODEL] and plan.steps[1].teacher is None
        assert plan.steps[0].recipe == plan.steps[1].recipe == Recipe()
        assert wide.context[NARROW] == narrow_plan.context()
    assert tiny.spec == narrow_plan.spec and not tiny.models and tiny.returns == (MODEL,)
    assert not pte.models and pte.returns == (MODEL,)  # no torch runtime: its own window only
    kd = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125, also_narrowest_kd=0.5)
    step = kd.configure_train(1, weights, DEVICES[:1])[0].plan().steps
    assert step[0].recipe.loss == "ce" and (step[1].recipe.loss, step[1].recipe.alpha, step[1].teacher) == \
        ("kd", 0.5, NARROW)
    global_kd = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125, also_narrowest_kd=0.5,
                                         also_narrowest_kd_teacher="global")
    frozen = global_kd.configure_train(1, weights, DEVICES[:1])[0]
    assert frozen.plan().steps[1].teacher == "teacher" and frozen.returns == (MODEL, NARROW)
    assert frozen.models["teacher"].spec == narrow_plan.spec  # the fleet's narrow model, as received
    assert all(np.array_equal(frozen.models["teacher"].weights[k], frozen.models[NARROW].weights[k])
               for k in frozen.models[NARROW].weights)


def _trained(instruction, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(size=v.shape).astype(v.dtype) for k, v in instruction.weights.items()}


def test_the_narrow_window_is_fedavg_of_every_narrow_model_in_the_updates_order_bit_for_bit() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125)
    weights = method.initial_weights(0)
    instructions = method.configure_train(1, weights, DEVICES[:3])
    updates = []
    for i, ins in enumerate(instructions):
        others = {NARROW: _trained(ins.all_models()[NARROW], 100 + i)} if NARROW in ins.models else {}
        updates.append(ClientUpdate(ins.device_id, DEVICES[i].num_samples, _trained(ins, i), {}, ins, others))
    new = method.aggregate_train(1, weights, updates)
    narrow_map = method.layout.plan(0.125, {}).index_map
    narrows = [(u.others[NARROW] if NARROW in u.others else u.weights, u.num_samples) for u in updates]
    fedavg = weighted_average(narrows)  # AllSmall's aggregate of the same narrow models
    assert all(np.array_equal(extract(new, narrow_map)[k], fedavg[k]) for k in fedavg)
    # outside the narrow window: the coverage mean of the two wide windows (their inner values discarded)
    wide = coverage_average(weights, method.contributions(updates[:2]))
    outside = np.ones(weights["layers.9.weight"].shape, bool)
    outside[np.ix_(*narrow_map["layers.9.weight"])] = False
    assert np.array_equal(new["layers.9.weight"][outside], wide["layers.9.weight"][outside])


def test_every_feature_refuses_it_in_one_line_and_bad_options_are_refused() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125)
    for feature in FEATURES:
        reason = why_not(method, feature)
        assert reason and "also_narrowest" in reason and "two models" in reason and "\n" not in reason
    assert why_not(method_class("heterofl")(SPEC, Recipe()), FEATURES[0]) is None
    for options, message in (({"also_narrowest": 1.0}, "also_narrowest takes a ratio in"),
                             ({"also_narrowest": 0.125, "also_narrowest_inner": "x"}, "'narrow' or"),
                             ({"also_narrowest": 0.125, "also_narrowest_kd": 2}, "also_narrowest_kd takes"),
                             ({"also_narrowest_kd_teacher": "x"}, "'trained' or"),
                             ({"also_narrowest": 0.125, "narrowest_owns": True}, "exclude each other")):
        with pytest.raises(OptionError, match=message):
            method_class("heterofl")(SPEC, Recipe(), **options)


def _run(tmp_path, method: str, options: dict) -> tuple[list[dict], Simulation]:
    config = SimulationConfig(method=method, dataset="digits", model="small_cnn", devices=6, rounds=4, seed=0,
                              grid="inprocess", tiers=["1.0", "0.5", "0.25"], method_options=options,
                              recipe=Recipe(epochs=2, batch_size=16, lr=0.05, momentum=0.9).to_dict())
    simulation = Simulation(config, tmp_path / method)
    simulation.run()
    rows = (tmp_path / method / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in rows], simulation


def test_on_digits_the_narrowest_tier_deploys_allsmalls_model_and_the_wide_tiers_train(tmp_path) -> None:
    nested, run = _run(tmp_path, "heterofl", {"also_narrowest": 0.25, "fresh_windows": [0.5, 0.25]})
    small, control = _run(tmp_path, "allsmall", {"small_model": "width:0.25", "strong_tiers": ["1.0"]})
    # every round: the 0.25 window is AllSmall's model bit for bit (so every device's narrow copy
    # came back and was averaged, in FedAvg's order), while the wide windows train beside it
    assert [r["accuracy_tier_0.25"] for r in nested] == [r["accuracy"] for r in small]
    window = extract(run.loop.global_weights, run.loop.method.layout.plan(0.25, {}).index_map)
    assert all(np.array_equal(window[k], v) for k, v in control.loop.global_weights.items())
    assert small[-1]["accuracy"] > 0.3
    assert nested[-1]["accuracy_tier_1.0"] > nested[0]["accuracy_tier_1.0"] + 0.2
    assert nested[-1]["accuracy_tier_0.5"] > nested[0]["accuracy_tier_0.5"] + 0.2


def test_a_bundle_edge_is_left_out_in_one_line_since_a_bundle_carries_one_model_per_member(caplog) -> None:
    from server_toolkit.edge.bundle import expand

    members = [{"device_id": "m1", "num_samples": 10, "tier": "1.0"}]
    edge = DeviceInfo("edge-1", 10, profile={"role": "edge", "members": members, "aggregates": "sums"})
    nested = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125)
    assert expand(nested, 1, [edge, DEVICES[0]]) == ([DEVICES[0]], {})
    assert "edge edge-1 left out: edges do not support heterofl: with also_narrowest" in caplog.text
    owning = method_class("heterofl")(SPEC, Recipe(), narrowest_owns=True)  # one model a task: relayed
    assert expand(owning, 1, [edge])[1] == {"m1": "edge-1"}


@pytest.mark.parametrize("feature", [{"secagg": {"threshold": 0.5}}, {"edges": 2}])
def test_simulate_refuses_secagg_and_edges_before_starting_anything(tmp_path, feature) -> None:
    config = SimulationConfig(method="heterofl", dataset="digits", model="small_cnn", devices=4, rounds=1,
                              grid="mqtt", tiers=["1.0", "0.25"], method_options={"also_narrowest": 0.25},
                              **feature)
    with pytest.raises(ValueError, match=r"support heterofl: with also_narrowest each device returns two"):
        Simulation(config, tmp_path / "run").run()
    assert not (tmp_path / "run" / "blobs").exists()  # refused before the broker and the devices


def test_with_also_nested_a_full_device_also_trains_the_fleets_middle_window_and_returns_it() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125, also_nested=True)
    weights = method.initial_weights(0)
    full, half, tiny, _ = method.configure_train(1, weights, DEVICES)
    middle = method.layout.plan(0.5, {})
    assert [s.model for s in full.plan().steps] == [NARROW, "nested_1", MODEL]
    assert full.returns == (MODEL, NARROW, "nested_1") and full.context["nested_1"] == middle.context()
    assert full.models["nested_1"].spec == middle.spec
    assert all(np.array_equal(full.models["nested_1"].weights[k], v)
               for k, v in extract(weights, middle.index_map).items())
    assert [s.model for s in half.plan().steps] == [NARROW, MODEL]  # nothing between 0.125 and 0.5
    assert tiny.returns == (MODEL,)


def test_with_also_nested_each_window_level_is_averaged_over_that_levels_models_only() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125, also_nested=True)
    weights = method.initial_weights(0)
    instructions = method.configure_train(1, weights, DEVICES[:3])
    updates = []
    for i, ins in enumerate(instructions):
        models = ins.all_models()
        others = {name: _trained(models[name], 10 * i + k)
                  for k, name in enumerate(ins.returns) if name != MODEL}
        updates.append(ClientUpdate(ins.device_id, DEVICES[i].num_samples, _trained(ins, i), {}, ins, others))
    full, half, tiny = updates
    new = method.aggregate_train(1, weights, updates)
    plans = {r: method.layout.plan(r, {}).index_map for r in (0.125, 0.5, 1.0)}
    # 0.125 window: FedAvg of the three narrow models (the tiny device's own model among them)
    fedavg = weighted_average([(full.others[NARROW], 30), (half.others[NARROW], 20), (tiny.weights, 10)])
    assert all(np.array_equal(extract(new, plans[0.125])[k], fedavg[k]) for k in fedavg)
    # the 0.5 window outside it: the half device's own model and the full device's middle window
    middle = coverage_average(weights, [(full.others["nested_1"], plans[0.5], 30),
                                        (half.weights, plans[0.5], 20)])
    name = "layers.9.weight"
    ring = np.zeros(weights[name].shape, bool)
    ring[np.ix_(*plans[0.5][name])] = True
    ring[np.ix_(*plans[0.125][name])] = False
    assert np.array_equal(new[name][ring], middle[name][ring])
    # outside the 0.5 window: the full device's own model alone
    outer = np.ones(weights[name].shape, bool)
    outer[np.ix_(*plans[0.5][name])] = False
    assert np.array_equal(new[name][outer], full.weights[name][outer])
    with pytest.raises(OptionError, match="also_nested needs also_narrowest"):
        method_class("heterofl")(SPEC, Recipe(), also_nested=True)
    with pytest.raises(OptionError, match="also_nested needs also_narrowest"):
        method_class("heterofl")(SPEC, Recipe(), also_narrowest=0.125, also_nested=True,
                                 also_narrowest_kd=0.5)


def test_on_digits_also_nested_keeps_allsmalls_narrowest_model_and_trains_every_tier(tmp_path) -> None:
    nested, _ = _run(tmp_path, "heterofl", {"also_narrowest": 0.25, "also_nested": True,
                                            "fresh_windows": [0.5, 0.25], "deploy": "nested"})
    small, _ = _run(tmp_path, "allsmall", {"small_model": "width:0.25", "strong_tiers": ["1.0"]})
    assert [r["accuracy_tier_0.25"] for r in nested] == [r["accuracy"] for r in small]
    assert nested[-1]["accuracy_tier_1.0"] > nested[0]["accuracy_tier_1.0"] + 0.2
    assert nested[-1]["accuracy_tier_0.5"] > nested[0]["accuracy_tier_0.5"] + 0.2
