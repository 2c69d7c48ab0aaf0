"""Alone: each tier's devices train their own model among themselves (issue 32's control).

A heterogeneous method is worth its keep only if every tier ends better than by training
with the whole fleet on the smallest model (``allsmall``, ``fedavg-s-exit``) and better than
by training alone, with the devices of its own tier only. This is the second control: one
FedAvg federation per tier, side by side in one run, each of that tier's devices only,
training the model that tier deploys under method ``of`` (``Method.deployable``: HeteroFL's
width window, DepthFL's exit prefix, RecipFL's small or large model), from a fresh seeded
initialisation of that model, by ``of``'s recipe for the tier (``tier_plan``: DepthFL's
self-distillation included). So "tier t: X vs alone Z" differs only in who trains with
whom, and ``accuracy_tier_<t>`` scores the tier as ``of`` scores it (DepthFL's ensemble over
exits included). With ``of=recipfl`` (strong / weak) it is ExclusiveFL. A method that trains
on server data (FedConv) is refused: the tiers alone have none; FedConv's tier models have
the width sub-models' shapes, so ``of=heterofl`` gives its control.

Decisions: a fresh initialisation, not ``of``'s initial weights cut to the tier's model: a
width window cut from the full model keeps the full fan-in's initial scale, sqrt(r) of a
fresh init's (lenet5's 0.25 window: weight std 0.5x beyond the first layer, logit std 0.05
against 0.11); trained alone from it, that window stayed at chance for all 15 rounds on
Fashion-MNIST (α 0.5, seed 0), while AllSmall's fresh model of the same shape was at 0.39
after round 2. A tier's model joins the global weights the first round one of its devices is
selected (the method learns the fleet's tiers from the devices, as the others do), its
tensor names prefixed ``<tier>|`` (``default|`` for devices without a tier); a tier that
sends nothing in a round keeps its weights. ``accuracy`` / ``loss`` are those of the largest
tier model trained so far (most parameters): the quality guard watches that one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ..reconstruct.average import weighted_average
from .abilities import wants_server_data
from .base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from .options import MethodOptions, option
from .tier_accuracy import DEFAULT_TIER, model_accuracy

SEPARATOR = "|"  # between a tier's name and a tensor name; tier names and tensor names have dots


@dataclass(frozen=True)
class AloneOptions(MethodOptions):
    """The options of ``alone``."""

    of: str = option("heterofl", "The heterogeneous method whose tier models the tiers train alone "
                     "(its deployable model and tier recipe), e.g. heterofl, depthfl, recipfl.")
    of_options: dict[str, object] = option({}, "That method's options, e.g. {\"small_model\": "
                                           "\"width:0.3\"} for recipfl.")


def tier_name(tier: str | None) -> str:
    return DEFAULT_TIER if tier is None else str(tier)


def in_tier(weights: Weights, tier: str) -> Weights:
    """The tensors of ``tier``'s model, without the tier prefix."""
    prefix = tier + SEPARATOR
    return {name[len(prefix):]: value for name, value in weights.items() if name.startswith(prefix)}


class Alone(Method):
    name = "alone"
    family = "control"
    example = "--tiers 1.0,0.5,0.25 --method-option of=heterofl"
    Options = AloneOptions
    options: AloneOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        from . import method_class

        super().__init__(global_spec, recipe, **options)
        if self.options.of == self.name:
            raise ValueError("method 'alone': option of= names the method whose tiers train alone, "
                             "not 'alone'")
        try:
            of = method_class(self.options.of)
        except ValueError as exc:
            raise ValueError(f"method 'alone', option of: {exc}") from None
        self.of = of(global_spec, recipe, **self.options.of_options)
        if wants_server_data(self.of):
            raise ValueError(f"method 'alone': {self.options.of} trains on server data the tiers alone "
                             "would not have; its tier models are width sub-models: use of=heterofl")
        self.deploys_ensemble = bool(getattr(self.of, "deploys_ensemble", False))
        self.seed = 0
        self.specs: dict[str, dict] = {}  # tier -> its model's spec, once its devices were seen

    def initial_weights(self, seed: int) -> Weights:
        """None yet: a tier's model joins on its devices' first round (module docstring)."""
        self.seed = seed
        return {}

    def tier_model(self, device: DeviceInfo) -> tuple[dict, Weights]:
        """(spec, fresh seeded weights) of the model ``device``'s tier deploys under ``of``."""
        from fedcore.torch_model import build_model, state_numpy

        found = self.of.deployable(self.of.initial_weights(self.seed), device)
        if found is None:
            raise ValueError(f"method 'alone': {self.options.of} has no model for tier {device.tier!r}")
        spec, cut = found
        fresh = state_numpy(build_model(spec, seed=self.seed))
        return spec, {name: fresh[name] for name in cut}  # what the device keeps, it keeps

    def tier_plan(self, tier: str | None) -> tuple[dict, Recipe]:
        return self.of.tier_plan(tier)

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        out = []
        for device in devices:
            tier = tier_name(device.tier)
            weights = in_tier(global_weights, tier)
            if not weights:
                self.specs[tier], weights = self.tier_model(device)
            recipe = self.of.tier_plan(device.tier)[1]
            out.append(TrainInstruction(device.device_id, self.specs[tier], weights, recipe,
                                        context={"tier": tier}))
        return out

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        new = dict(global_weights)
        for tier in sorted({u.instruction.context["tier"] for u in updates}):
            group = [(u.weights, u.num_samples) for u in updates if u.instruction.context["tier"] == tier]
            new.update({tier + SEPARATOR + k: v for k, v in weighted_average(group).items()})
        return new

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights] | None:
        """The model the tier's devices trained among themselves; None before its first round."""
        tier = tier_name(device.tier)
        weights = in_tier(global_weights, tier)
        return (self.specs[tier], weights) if weights and tier in self.specs else None

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        """The largest trained tier model's accuracy and loss (module docstring); {} before any."""
        from fedcore.torch_model import build_model, load_numpy
        from fedcore.torch_train import evaluate_model

        trained = {t: in_tier(global_weights, t) for t in self.specs}
        trained = {t: w for t, w in trained.items() if w}
        if not trained:
            return {}
        tier = max(trained, key=lambda t: sum(v.size for v in trained[t].values()))
        model = build_model(self.specs[tier])
        own = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
        if own - set(trained[tier]):  # running statistics left on the devices: no loss to report
            return {"accuracy": model_accuracy(self.specs[tier], trained[tier], x, y)}
        load_numpy(model, trained[tier])
        stats = evaluate_model(model, x, y)
        return {"accuracy": stats.accuracy, "loss": stats.loss}

    def state_dict(self) -> dict:
        return {"specs": self.specs}

    def load_state_dict(self, state: dict) -> None:
        self.specs = dict(state.get("specs", {}))
