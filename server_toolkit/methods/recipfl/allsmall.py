"""AllSmall (RecipFL's baseline): FedAvg of the small model on every device, strong or weak.

The global model is the small architecture (see ``strong_weak``); strong devices train it
like weak ones, so they never benefit from their capacity (and their "target model" is
the small one). Options (``StrongWeakOptions``, ``fedsdk-server methods show allsmall``):
``small_model`` (default "width:0.25"), ``strong_tiers`` ("strong"; here it only says which
devices count as strong in ``accuracy_strong``). Central
evaluation: the global model's ``accuracy``, and ``accuracy_strong`` / ``accuracy_weak``
(``target_accuracy``).
"""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe

from ..base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..capability import FULL, WeightedSum
from ..fedavg import FedAvg
from ..target_accuracy import TargetAccuracy
from .strong_weak import StrongWeakOptions, strong_weak


class AllSmall(FedAvg):
    name = "allsmall"
    ignores_tiers = False  # strong / weak tiers pick its reports
    weighted_sum = WeightedSum(FULL, secure=False)  # FedAvg's; not in the SecAgg plan (docs/privacy.md)
    asks = {"label_counts": {}}  # accuracy_strong / accuracy_weak weigh the test set by them
    family = "resource-skew"
    example = ("--model lenet5 --devices 6 --partition quantity-skew --num-strong 1 "
               "--tiers strong,weak,weak,weak,weak,weak --method-option small_model=width:0.3")
    Options = StrongWeakOptions
    options: StrongWeakOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.fleet = strong_weak(global_spec, self.options.small_model, self.options.strong_tiers)
        self.global_spec = self.fleet.small  # the global model is the small one
        self.targets = TargetAccuracy(int(global_spec["num_classes"]))

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.targets.see(devices, self.fleet.role)
        return super().configure_train(round_number, global_weights, devices)

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        self.targets.report(updates)
        return super().aggregate_evaluate(round_number, updates)

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        return {**super().evaluate(global_weights, x, y),
                **self.targets.evaluate(lambda device, role: (self.global_spec, global_weights), x, y)}

    def state_dict(self) -> dict:
        return {"targets": self.targets.state()}

    def load_state_dict(self, state: dict) -> None:
        self.targets.load(state.get("targets", {}))
