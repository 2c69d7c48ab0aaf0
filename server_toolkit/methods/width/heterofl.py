"""HeteroFL (Diao et al., 2021): every tier trains the top-left block of each layer.

A device of ratio r gets the first ``ceil(r * C)`` channels of every hidden channel space
(window offset 0, the same every round); results are averaged per element over the
devices covering it. Static BatchNorm; tiers as in ``width_shared``.

As RecipFL's width-scaled baseline: name the tiers ``strong`` and ``weak`` and give their
ratios, e.g. ``--tiers strong,weak,weak --method-option tier_ratios={"strong":1.0,"weak":0.3}``;
evaluation then also reports ``accuracy_strong`` / ``accuracy_weak``: each device's own
width-r sub-model on the test set re-weighted to its labels (``target_accuracy``).
"""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe

from ...submodels.offsets import heterofl_offsets
from ...submodels.width import extract
from ..base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..target_accuracy import TargetAccuracy, role_by_tier_name
from .width_shared import WidthSharedMethod


class HeteroFL(WidthSharedMethod):
    name = "heterofl"
    asks = {"label_counts": {}}  # accuracy_strong / accuracy_weak weigh the test set by them
    family = "width"
    example = "--tiers 1.0,0.75,0.5,0.25"

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.targets = TargetAccuracy(int(global_spec["num_classes"]))

    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        return heterofl_offsets(self.layout, ratio, round_number)

    def role_of(self, device: DeviceInfo) -> str | None:
        return role_by_tier_name(device)

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.targets.see(devices, self.role_of)
        return super().configure_train(round_number, global_weights, devices)

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        self.targets.report(updates)
        return super().aggregate_evaluate(round_number, updates)

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        def target(device: DeviceInfo, role: str) -> tuple[dict, Weights]:
            plan = self.plan_for(0, device)
            return plan.spec, extract(global_weights, plan.index_map)

        return {**super().evaluate(global_weights, x, y), **self.targets.evaluate(target, x, y)}

    def state_dict(self) -> dict:
        return {"targets": self.targets.state()}

    def load_state_dict(self, state: dict) -> None:
        self.targets.load(state.get("targets", {}))
