"""The common frame of the width-shared methods (HeteroFL, FedRolex, FedDM).

A device of tier ratio r trains a width-r sub-model cut from the global model (see
``submodels/width.py``); the server puts every result back element by element
(``methods/width/coverage.py``). Subclasses only say where each device's windows start
(``offsets``). The program a device receives is the sub-model's own spec: it never sees
the global shape.

Tiers: a device's ratio comes from its tier (``DeviceInfo.tier``, resolved before the
method sees the device), a tier being a ratio ("0.5") or a name in the ``tier_ratios``
option (``methods/tiers.py``; ``fedsdk-server methods show heterofl`` lists the options).

What a tier deploys (option ``deploy``, issue 32): ``"window"`` (default), its width-r window
at offset 0; ``"nested"``, the mean softmax of that window and the windows of every narrower
ratio of the fleet, which are blocks of it (a full device at tiers 1.0 / 0.5 / 0.125 runs
1 + 1/4 + 1/64 of its window's compute, in the memory of its window). Why (measured, lenet5 on
Fashion-MNIST, BENCHMARKS "Nested deployment"): the wide windows' outer channels are trained by
the wide devices only, and at α 0.1 each holds a few classes; averaging with the narrow window,
which every device trained, keeps the wide windows' gain and damps their skew. Only the
scoring changes (``methods/tier_accuracy.py``): training, programs and aggregation do not.

The global spec's BatchNorm layers are made static (``track: false``), so sub-models and
the global model have the same tensors (see ``static_bn``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fedcore.recipe import Recipe

from ...submodels.width import IndexMap, WidthPlan, extract, plan_args, static_bn, width_layout
from ..base import ClientUpdate, DeviceInfo, Method, ModelRecord, TrainInstruction, Weights
from ..capability import WINDOW, WeightedSum
from ..holdout_members import member_models
from ..options import MethodOptions, OptionError, option
from ..summands import Summand
from ..tiers import tier_ratio
from .coverage import coverage_average


@dataclass(frozen=True)
class WidthOptions(MethodOptions):
    """The options every width method takes (HeteroFL and FedRolex take only these)."""

    tier_ratios: dict[str, float] = option(
        {}, "Width ratio in (0, 1] of each named tier, e.g. {\"phone\": 0.75}; other tiers are ratios.")
    deploy: str = option(
        "window", "What a tier deploys: 'window' (its width-r window) or 'nested' (the mean softmax of its "
        "window and every narrower tier's window inside it).")


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
        if self.options.deploy not in ("window", "nested"):
            raise OptionError(f"method {self.name!r}: option deploy takes 'window' or 'nested', "
                              f"got {self.options.deploy!r}")
        self.fleet_ratios: set[float] = set()  # the ratios of the devices asked to train so far

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

    def deployable_members(self, global_weights: Weights,
                           device: DeviceInfo) -> list[tuple[dict, Weights]]:
        """``deploy="window"``: the tier's window alone. ``"nested"``: its window and the window
        (offset 0) of every narrower ratio the fleet has (the tiers asked to train so far, and
        ``nested_ratios``), widest first; they are blocks of the tier's own weights, so the device
        holds them already and runs them in about sum((q / r)²) of its window's compute."""
        own = self.ratio_of(device)
        ratios = [own]
        if self.options.deploy == "nested":
            narrower = {q for q in self.fleet_ratios | set(self.nested_ratios()) if q < own}
            ratios += sorted(narrower, reverse=True)
        source = self.source_weights(global_weights, device)
        plans = [self.layout.plan(ratio, {}) for ratio in ratios]
        return [(plan.spec, extract(source, plan.index_map)) for plan in plans]

    def holdout_members(self, global_weights: Weights, device: DeviceInfo,
                        instruction: TrainInstruction) -> tuple[dict[str, ModelRecord], tuple[str, ...]]:
        """``deploy="nested"``: the narrower windows of ``deployable_members``, found among the
        task's models (``also_narrowest``'s ``"narrow"``, ``"nested_k"``) or added to it
        (``methods/holdout_members.py``), so the device's held-back score is the nested ensemble's."""
        if self.options.deploy != "nested":
            return {}, ()
        narrower = self.deployable_members(global_weights, device)[1:]
        return member_models(instruction, narrower, device.runtimes)

    def nested_ratios(self) -> list[float]:
        """Ratios whose windows a ``"nested"`` deployment includes even before a device of that
        ratio was asked to train (default none; HeteroFL: its ``also_narrowest``)."""
        return []

    def plan_for(self, round_number: int, device: DeviceInfo) -> WidthPlan:
        """The sub-model ``device`` trains in ``round_number`` (deterministic)."""
        ratio = self.ratio_of(device)
        return self.layout.plan(ratio, self.offsets(round_number, device, ratio))

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        instructions = []
        self.fleet_ratios.update(self.ratio_of(device) for device in devices)
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
