"""Unit tests of tier costing and assignment (server_toolkit.fleet.tiers)."""

from __future__ import annotations

import pytest

from fedcore.recipe import Recipe
from server_toolkit.fleet.tiers import ASSUMED_SAMPLES, SpecCost, choose_tier, spec_cost, train_memory_mb
from server_toolkit.methods.exit.depthfl import DepthFL
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec

RECIPE = {"epochs": 2, "batch_size": 10, "optimizer": "sgd"}


@pytest.mark.parametrize("model", ["small_cnn", "vgg_multi_exit", "resnet_small"])
def test_parameter_count_matches_torch(model):
    from fedcore.torch_model import build_model

    spec = model_spec(model, (1, 8, 8), 10)
    assert spec_cost(spec).params == sum(p.numel() for p in build_model(spec).parameters())


def test_flops_and_activations_of_a_small_model_by_hand():
    spec = {
        "format": "torchspec/1",
        "input_shape": [1, 4, 4],
        "num_classes": 3,
        "layers": [
            {"op": "conv2d", "in": 1, "out": 2, "k": 3, "pad": 1},
            {"op": "relu"},
            {"op": "flatten"},
            {"op": "linear", "in": 32, "out": 3},
        ],
    }
    cost = spec_cost(spec)
    assert cost.params == (9 * 2 + 2) + (32 * 3 + 3)
    assert cost.flops == 2 * 9 * 2 * 16 + 2 * 32 * 3  # multiply-adds of conv (2x4x4 outputs) and linear
    assert cost.activations == 32 + 32 + 32 + 3


def test_tier_sub_models_shrink_with_the_tier():
    recipe = Recipe(batch_size=16)
    width = HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), recipe)
    costs = [spec_cost(width.tier_plan(t)[0]) for t in ("1.0", "0.5", "0.25")]
    assert costs[0].params > costs[1].params > costs[2].params
    assert spec_cost(width.tier_plan(None)[0]) == costs[0]
    depth = DepthFL(model_spec("vgg_multi_exit", (1, 8, 8), 10), recipe)
    assert spec_cost(depth.tier_plan("1")[0]).flops < spec_cost(depth.tier_plan("3")[0]).flops
    assert depth.tier_plan("1")[1].optimizer == "adam"  # the method's own device recipe
    with pytest.raises(ValueError):
        depth.tier_plan("7")


COSTS = {
    "big": SpecCost(1_000_000, 4e8, 1_000_000),
    "mid": SpecCost(250_000, 1e8, 250_000),
    "small": SpecCost(60_000, 2.5e7, 60_000),
}


def _profile(
    available_mb: float,
    step_ms: float | None,
    samples: int | None = 100,
    base_mb: float = 100.0,
    tier: str = "big",
    flops_scaled: bool = True,
):
    """A profile with ``tier`` timed at ``step_ms`` and (``flops_scaled``) the other tiers at
    that time scaled by their FLOPs; an ExecuTorch row that failed is ignored."""
    tiers = {}
    if step_ms is not None:
        for name, cost in COSTS.items():
            if name == tier or flops_scaled:
                ms = step_ms * cost.flops / COSTS[tier].flops
                tiers[name] = {
                    "runtimes": [
                        {"runtime": "torch", "format": "torchspec/1", "ms_per_step": ms},
                        {"runtime": "executorch", "format": "pte/1", "ms_per_step": None, "error": "failed"},
                    ]
                }
    return {
        "memory_available_mb": available_mb,
        "num_samples": samples,
        "bench": {"tiers": tiers, "base_rss_mb": base_mb},
    }


def test_a_strong_device_gets_the_largest_tier():
    choice = choose_tier(_profile(8000, 10.0), COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    assert choice.tier == "big" and choice.reason["fits"]
    assert choice.reason["steps_per_round"] == 2 * 10  # epochs * ceil(100 / 10)
    assert [r["tier"] for r in choice.reason["tiers"]] == ["big", "mid", "small"]
    assert "tier big" in choice.reason["summary"]


def test_memory_decides_for_a_small_device():
    need = {name: 100 + train_memory_mb(c, 10, "sgd") for name, c in COSTS.items()}
    available = 2 * (need["mid"] + need["big"]) / 2  # budget = half: between mid and big
    choice = choose_tier(_profile(available, 1.0), COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    assert choice.tier == "mid"
    rows = {r["tier"]: r for r in choice.reason["tiers"]}
    assert not rows["big"]["fits_memory"] and rows["mid"]["fits_memory"]
    assert "tier big would not fit (memory)" in choice.reason["summary"]


def test_step_time_decides_for_a_slow_device():
    # big: 20 steps x 2000 ms = 40 s > 30 s budget; mid: a quarter of the FLOPs -> 10 s
    choice = choose_tier(_profile(64000, 2000.0), COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    assert choice.tier == "mid"
    rows = {r["tier"]: r for r in choice.reason["tiers"]}
    assert rows["big"]["round_s"] == pytest.approx(40.0) and rows["mid"]["round_s"] == pytest.approx(10.0)
    assert "would not fit (time)" in choice.reason["summary"]


def test_measured_step_times_win_and_missing_tiers_are_scaled_from_the_nearest():
    profile = _profile(64000, 1000.0, tier="mid", flops_scaled=False)  # only mid was timed: 1 s per step
    profile["bench"]["tiers"]["small"] = {
        "runtimes": [{"runtime": "torch", "format": "torchspec/1", "ms_per_step": 900.0}]
    }  # overhead-bound: not 1/4
    choice = choose_tier(profile, COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    rows = {r["tier"]: r for r in choice.reason["tiers"]}
    assert rows["mid"]["step_ms"] == 1000.0 and rows["mid"]["step_source"] == "measured"
    assert rows["small"]["step_ms"] == 900.0
    assert (
        rows["big"]["step_ms"] == pytest.approx(4000.0)
        and rows["big"]["step_source"] == "scaled from tier mid"
    )
    assert choice.tier == "mid"  # 20 s; big would be 80 s > 30 s
    assert "scaled" not in choice.reason["summary"] and "torch" in choice.reason["summary"]


def test_nothing_fits_the_smallest_is_flagged_and_unknowns_are_said():
    choice = choose_tier(_profile(10, 1e6, samples=None), COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    assert choice.tier == "small" and not choice.reason["fits"]
    assert "below the fleet's requirements" in choice.reason["summary"]
    assert choice.reason["samples"] == ASSUMED_SAMPLES and choice.reason["samples_assumed"]
    unmeasured = choose_tier(_profile(8000, None), COSTS, COSTS["big"], RECIPE, round_timeout_s=60)
    assert unmeasured.tier == "big" and "no step time measured" in unmeasured.reason["summary"]


def test_without_tiers_the_full_model_is_checked():
    profile = {
        "memory_available_mb": 8000,
        "num_samples": 100,
        "bench": {"tiers": {"": {"runtimes": [{"runtime": "torch", "ms_per_step": 10.0}]}}},
    }
    choice = choose_tier(profile, {}, COSTS["mid"], RECIPE, round_timeout_s=60)
    assert choice.tier is None and choice.reason["fits"] and "full model" in choice.reason["summary"]
    assert choice.reason["tiers"][0]["round_s"] == pytest.approx(0.2)
