"""HeteroFL's ``fresh_windows`` (the named windows start as a fresh model of their own shape)
and ``train_widths`` (a wider device trains a narrower window in some rounds)."""

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.options import OptionError
from server_toolkit.models.zoo import model_spec
from server_toolkit.submodels.width import extract

SPEC = model_spec("lenet5", (1, 28, 28), 10)


def _window(weights: dict, method, ratio: float) -> dict:
    return extract(weights, method.layout.plan(ratio, {}).index_map)


def test_the_smallest_fresh_window_is_a_fresh_model_of_its_shape_and_the_rest_keeps_the_full_init() -> None:
    plain = method_class("heterofl")(SPEC, Recipe())
    fresh = method_class("heterofl")(SPEC, Recipe(), fresh_windows=[0.5, 0.25])
    before, after = plain.initial_weights(7), fresh.initial_weights(7)
    small = state_numpy(build_model(fresh.layout.plan(0.25, {}).spec, seed=7))
    assert all(np.array_equal(_window(after, fresh, 0.25)[name], small[name]) for name in small)
    # cut from the full model, the window had the full fan-in's smaller scale (the reason for the option)
    assert np.std(_window(before, plain, 0.25)["layers.9.weight"]) < 0.6 * np.std(small["layers.9.weight"])
    # the 0.5 window's rows beyond the 0.25 window come from a fresh 0.5 model; outside it, the full init
    medium = state_numpy(build_model(fresh.layout.plan(0.5, {}).spec, seed=7))["layers.9.weight"]
    window = _window(after, fresh, 0.5)["layers.9.weight"]
    small_rows = small["layers.9.weight"].shape[0]
    assert np.array_equal(window[small_rows:], medium[small_rows:])
    outside = np.ones_like(after["layers.9.weight"], bool)
    outside[:window.shape[0], :window.shape[1]] = False
    assert np.array_equal(after["layers.9.weight"][outside], before["layers.9.weight"][outside])


def test_a_fresh_window_ratio_outside_zero_one_is_refused_in_one_line() -> None:
    with pytest.raises(OptionError, match=r"fresh_windows takes ratios in \(0, 1\), got \[1.0\]"):
        method_class("heterofl")(SPEC, Recipe(), fresh_windows=[0.25, 1.0])


def test_train_widths_draws_each_round_a_ratio_at_most_the_devices_own_and_deploys_its_own() -> None:
    method = method_class("heterofl")(SPEC, Recipe(), train_widths=[0.5, 0.25])
    full, half, small = (DeviceInfo(f"d{t}", 100, tier=t) for t in ("1.0", "0.5", "0.25"))
    drawn = {t.tier: [method.plan_for(r, t).ratio for r in range(1, 61)] for t in (full, half, small)}
    assert set(drawn["1.0"]) == {1.0, 0.5, 0.25} and set(drawn["0.5"]) == {0.5, 0.25}
    assert set(drawn["0.25"]) == {0.25}
    assert drawn["1.0"] == [method.plan_for(r, full).ratio for r in range(1, 61)]  # deterministic
    assert method.deployable(method.initial_weights(0), full)[0] == method.layout.plan(1.0, {}).spec
    assert {method_class("heterofl")(SPEC, Recipe()).plan_for(r, full).ratio for r in range(1, 9)} == {1.0}


def test_train_widths_weight_makes_the_narrower_windows_rarer_or_more_frequent_than_the_own_one() -> None:
    full = DeviceInfo("d1.0", 100, tier="1.0")

    def own_share(weight: float) -> float:
        method = method_class("heterofl")(SPEC, Recipe(), train_widths=[0.5, 0.25],
                                          train_widths_weight=weight)
        drawn = [method.training_ratio(r, full) for r in range(1, 601)]
        assert set(drawn) == {1.0, 0.5, 0.25}
        return drawn.count(1.0) / len(drawn)

    # own ratio's probability 1 / (1 + 2 w): 2/3 at w 0.25, 1/3 at w 1, 1/5 at w 2
    assert abs(own_share(0.25) - 2 / 3) < 0.06 and abs(own_share(2.0) - 1 / 5) < 0.06
    assert abs(own_share(1.0) - 1 / 3) < 0.06
    with pytest.raises(OptionError, match=r"train_widths_weight takes a number > 0, got 0"):
        method_class("heterofl")(SPEC, Recipe(), train_widths=[0.5], train_widths_weight=0)


def test_narrowest_owns_gives_each_element_the_mean_of_the_narrowest_windows_trained_over_it() -> None:
    from server_toolkit.methods.width.coverage import coverage_average, narrowest_average

    zeros = {"w": np.zeros((4, 4))}
    rows = (np.arange(2), np.arange(2))
    whole = (np.arange(4), np.arange(4))
    small = ({"w": np.ones((2, 2))}, {"w": rows}, 10.0)
    wide = ({"w": np.full((4, 4), 3.0)}, {"w": whole}, 10.0)
    owned = narrowest_average(zeros, [(1.0, wide), (0.5, small)])["w"]
    assert np.all(owned[:2, :2] == 1.0) and np.all(owned[2:, :] == 3.0) and np.all(owned[:, 2:] == 3.0)
    assert np.all(coverage_average(zeros, [wide, small])["w"][:2, :2] == 2.0)  # plain HeteroFL mixes them
    from server_toolkit.methods.capability import EDGES, why_not

    owning = method_class("heterofl")(SPEC, Recipe(), narrowest_owns=True)
    assert "narrowest_owns" in why_not(owning, EDGES)
    assert why_not(method_class("heterofl")(SPEC, Recipe()), EDGES) is None  # still a sum by default
    assert why_not(method_class("heterofl"), EDGES) is None
