"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown, 2019).

Devices train the full global model as in FedAvg; the server treats the change of the
sample-weighted average as a pseudo-gradient and applies momentum to it:

    delta = w - mean_i(w_i);  v = beta * v + delta;  w <- w - server_lr * v

Options (``--method-option``): ``beta`` (0.5) and ``server_lr`` (1.0; with beta 0 this is
FedAvg exactly). Decision (default beta, measured): the paper's best beta 0.9 comes with a
tuned server lr; at server_lr 1 it steps 1/(1 - beta) = 10x the averaged update once the
velocity builds up and overshot on digits (4 IID devices, 6 rounds, seed 0, accuracy per
round): beta 0.9 ended at 0.777 (0.838 in round 4, then 0.744), 0.9 with server_lr 0.3 at
0.855, 0.5 at 0.908, FedAvg at 0.944. Other decisions: BatchNorm running
statistics and integer tensors take the plain average (a statistic is not a descent
direction); the velocity ``v`` starts at zero and is checkpointed with the method state, so
a resumed run continues with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ..reconstruct.average import weighted_average
from ..torch_utils import tensors_from_json, tensors_to_json, to_numpy, to_torch
from .base import ClientUpdate, Weights
from .capability import FULL, WeightedSum
from .fedavg import FedAvg
from .options import MethodOptions, option

STATISTICS = ("running_mean", "running_var")


def with_momentum(name: str, value: np.ndarray) -> bool:
    """Whether the server momentum applies to this tensor (float, not a BN statistic)."""
    return value.dtype.kind == "f" and not name.endswith(STATISTICS)


@dataclass(frozen=True)
class FedAvgMOptions(MethodOptions):
    beta: float = option(0.5, "Server momentum in [0, 1) (0: FedAvg with a server step).", minimum=0.0)
    server_lr: float = option(1.0, "Server learning rate (> 0) applied to the velocity.")


class FedAvgM(FedAvg):
    name = "fedavgm"
    example = "--method-option beta=0.5"
    weighted_sum = WeightedSum(FULL, server_step=True)  # momentum on the sample-weighted mean
    Options = FedAvgMOptions
    options: FedAvgMOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        beta, server_lr = self.options.beta, self.options.server_lr
        if not beta < 1.0 or not server_lr > 0.0:
            raise ValueError(f"fedavgm needs 0 <= beta < 1 and server_lr > 0, got {beta}, {server_lr}")
        self.beta, self.server_lr = beta, server_lr
        self.velocity: Weights = {}

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        average = weighted_average([(u.weights, u.num_samples) for u in updates])
        out = dict(average)
        for name, new in average.items():
            old = global_weights[name]
            if not with_momentum(name, old):
                continue
            delta = old.astype(np.float32) - new.astype(np.float32)
            velocity = self.velocity.get(name)
            self.velocity[name] = delta if velocity is None else self.beta * velocity + delta
            out[name] = (old - self.server_lr * self.velocity[name]).astype(old.dtype)
        return out

    def state_dict(self) -> dict:
        return {"velocity": tensors_to_json(to_torch(self.velocity))}

    def load_state_dict(self, state: dict) -> None:
        self.velocity = to_numpy(tensors_from_json(state.get("velocity", {})))
