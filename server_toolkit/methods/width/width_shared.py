"""The common frame of the width-shared methods (HeteroFL, FedRolex, FedDM).

A device of tier ratio r trains a width-r sub-model cut from the global model (see
``submodels/width.py``); the server puts every result back element by element
(``methods/width/coverage.py``). Subclasses only say where each device's windows start
(``offsets``). The program a device receives is the sub-model's own spec: it never sees
the global shape.

Tiers: a device's ratio comes from its tier (``DeviceInfo.tier``, resolved before the
method sees the device), a tier being a ratio ("0.5") or a name in the ``tier_ratios``
option (``methods/tiers.py``; ``fedsdk-server methods show heterofl`` lists the options).

The global spec's BatchNorm layers are made static (``track: false``), so sub-models and
the global model have the same tensors (see ``static_bn``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fedcore.recipe import Recipe

from ...submodels.width import IndexMap, WidthPlan, extract, plan_args, static_bn, width_layout
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..capability import WINDOW, WeightedSum
from ..options import MethodOptions, option
from ..summands import Summand
from ..tiers import tier_ratio
from .coverage import coverage_average


@dataclass(frozen=True)
class WidthOptions(MethodOptions):
    """The options every width method takes (HeteroFL and FedRolex take only these)."""

    tier_ratios: dict[str, float] = option(
        {}, "Width ratio in (0, 1] of each named tier, e.g. {\"phone\": 0.75}; other tiers are ratios.")


class WidthSharedMethod(Method):
    """Base of the width methods (options: ``WidthOptions``)."""

    Options = WidthOptions
    options: WidthOptions
    weighted_sum = WeightedSum(WINDOW)  # coverage_average: per element, a mean of the covering updates

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(static_bn(global_spec), recipe, **options)
        self.layout = width_layout(self.global_spec)
        self.tier_ratios = dict(self.options.tier_ratios)
        self._index_maps: dict[str, IndexMap] = {}  # context (as JSON) -> its plan's index map

    # -- what subclasses decide ----------------------------------------------------------
    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        """Window start per hidden channel space for ``device`` in this round (default: 0)."""
        return {}

    def source_weights(self, global_weights: Weights, device: DeviceInfo) -> Weights:
        """The full-shape weights ``device``'s sub-model is cut from (default: the global ones)."""
        return global_weights

    # -- the Method interface ------------------------------------------------------------
    def ratio_of(self, device: DeviceInfo) -> float:
        """The width ratio of ``device`` (see ``methods/tiers.py``); ValueError if unknown."""
        return tier_ratio(device, self.tier_ratios)

    def tier_plan(self, tier: str | None) -> tuple[dict, Recipe]:
        ratio = self.ratio_of(DeviceInfo("tier", 0, tier=tier))
        return self.layout.plan(ratio, {}).spec, self.recipe

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """The tier's width-r window at offset 0 (the top-left block HeteroFL evaluates; a
        rolling window's start is a training device, not a deployment, choice)."""
        plan = self.layout.plan(self.ratio_of(device), {})
        return plan.spec, extract(self.source_weights(global_weights, device), plan.index_map)

    def plan_for(self, round_number: int, device: DeviceInfo) -> WidthPlan:
        """The sub-model ``device`` trains in ``round_number`` (deterministic)."""
        ratio = self.ratio_of(device)
        return self.layout.plan(ratio, self.offsets(round_number, device, ratio))

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        instructions = []
        for device in devices:
            plan = self.plan_for(round_number, device)
            weights = extract(self.source_weights(global_weights, device), plan.index_map)
            instructions.append(TrainInstruction(device.device_id, plan.spec, weights, self.recipe,
                                                 plan.context()))
        return instructions

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        return coverage_average(global_weights, self.contributions(updates))

    def index_map(self, context: dict) -> IndexMap:
        """Where the tensors of the plan with this ``context`` sit in the global ones."""
        key = json.dumps(context, sort_keys=True)
        if key not in self._index_maps:
            if len(self._index_maps) > 256:
                self._index_maps.clear()
            self._index_maps[key] = self.layout.plan(*plan_args(context)).index_map
        return self._index_maps[key]

    def contributions(self, updates: list[ClientUpdate]) -> list[tuple[Weights, IndexMap, float]]:
        """(weights, index map, samples) of each update, as ``coverage_average`` takes them."""
        return [(u.weights, self.index_map(u.instruction.context), u.num_samples) for u in updates]

    def summands(self, global_weights: Weights, update: ClientUpdate) -> dict[str, Summand]:
        index_map = self.index_map(update.instruction.context)
        return {name: Summand(value, index_map[name], float(update.num_samples))
                for name, value in update.weights.items() if name in index_map}
