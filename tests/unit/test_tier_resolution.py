"""A device's tier is resolved once, before any method sees it: the fleet's tier, else its
profile's, then the run's ``tier_map`` overrides applied by the round loop
(``methods/tiers.py``); methods read ``DeviceInfo.tier`` and nothing else."""

from __future__ import annotations

import pytest

from fedcore.recipe import Recipe
from server_toolkit.assembly import split_tier_map
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.tiers import resolve_tier, tier_ratio, with_tier_overrides
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, RoundLoop


def test_the_fleet_tier_wins_over_the_profile_and_the_profile_fills_in():
    assert resolve_tier("0.5", {"tier": "0.25"}) == "0.5"
    assert resolve_tier(None, {"tier": 0.25}) == "0.25"
    assert resolve_tier(None, {}) is None and resolve_tier(None, None) is None


def test_tier_map_overrides_only_the_devices_it_names():
    devices = [DeviceInfo("a", 10, "1.0"), DeviceInfo("b", 10, None)]
    assert [d.tier for d in with_tier_overrides(devices, {"b": "0.25"})] == ["1.0", "0.25"]
    assert with_tier_overrides(devices, {}) is devices


def test_tier_map_is_taken_off_the_method_options_by_the_assembly():
    options, tier_map = split_tier_map({"tier_map": {"dev0": 0.5}, "beta": 0.9})
    assert options == {"beta": 0.9} and tier_map == {"dev0": "0.5"}
    with pytest.raises(ValueError, match="tier_map must map device ids to tiers"):
        split_tier_map({"tier_map": ["dev0"]})


def test_a_width_ratio_comes_from_the_device_tier_or_a_named_tier():
    assert tier_ratio(DeviceInfo("a", 1, "0.5"), {}) == 0.5
    assert tier_ratio(DeviceInfo("a", 1, "phone"), {"phone": 0.75}) == 0.75
    assert tier_ratio(DeviceInfo("a", 1, None), {}) == 1.0
    with pytest.raises(ValueError, match="neither a ratio nor in tier_ratios"):
        tier_ratio(DeviceInfo("a", 1, "tablet"), {"phone": 0.75})


class SeenTiers(FedAvg):
    """FedAvg that remembers the tiers of the devices the round loop hands it."""

    name = ""  # not registered

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, str | None] = {}

    def configure_train(self, round_number, global_weights, devices):
        self.seen.update({d.device_id: d.tier for d in devices})
        return super().configure_train(round_number, global_weights, devices)


def test_the_round_loop_hands_methods_the_tiers_of_the_run_tier_map():
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    devices = [LocalDevice(DeviceInfo(f"dev{i}", 40, "1.0"), data.x_train[i * 40:(i + 1) * 40],
                           data.y_train[i * 40:(i + 1) * 40]) for i in range(2)]
    method = SeenTiers(spec, Recipe(epochs=1))
    loop = RoundLoop(method, InProcessGrid(devices), LoopConfig(rounds=1, tier_map={"dev1": "0.5"}))
    loop.start()
    loop.run()
    assert method.seen == {"dev0": "1.0", "dev1": "0.5"}


def test_a_method_no_longer_takes_tier_map_as_its_own_option():
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    with pytest.raises(TypeError, match="has no option 'tier_map'"):
        method_class("heterofl")(spec, Recipe(), tier_map={"b": "0.5"})
