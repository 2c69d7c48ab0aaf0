"""FedAvg: every device trains the full global model; sample-weighted average.

(FedAvg-S / FedAvg-L are FedAvg with the smallest / largest tier's model as the global
model; they need no code of their own.)
"""

from __future__ import annotations

from ..reconstruct.average import weighted_average
from ..submodels.base import FullModel
from .base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from .capability import FULL, WeightedSum
from .summands import Summand, whole


class FedAvg(Method):
    name = "fedavg"
    family = "averaging"
    ignores_tiers = True  # one model for every device: `--tiers` only warns (cli/run_checks.py)
    planner = FullModel()
    weighted_sum = WeightedSum(FULL)  # a sample-weighted average of whole tensors

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        sub = self.planner.plan(self.global_spec, global_weights, None, round_number)
        return [TrainInstruction(d.device_id, sub.spec, sub.weights, self.recipe) for d in devices]

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        return weighted_average([(u.weights, u.num_samples) for u in updates])

    def summands(self, global_weights: Weights, update: ClientUpdate) -> dict[str, Summand]:
        return whole(update.weights, update.num_samples)
