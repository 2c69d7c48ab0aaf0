"""Sub-model planning: how the server cuts the global model for one tier.

A planner turns (global spec, global weights, tier) into what one device trains: the
sub-model's spec and weights. The width-shared, exit-split and conv-compressed methods
each bring their own planner; ``FullModel`` (FedAvg) hands out the global model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class SubModel:
    """What one tier trains. ``index_map`` says where its tensors sit in the global ones
    (empty when the sub-model *is* the global model)."""

    spec: dict
    weights: Weights
    index_map: dict


class SubModelPlanner(Protocol):
    def plan(self, global_spec: dict, global_weights: Weights, tier: str | None,
             round_number: int) -> SubModel: ...


class FullModel:
    """Every tier trains the whole global model."""

    def plan(self, global_spec: dict, global_weights: Weights, tier: str | None,
             round_number: int) -> SubModel:
        return SubModel(global_spec, global_weights, {})
