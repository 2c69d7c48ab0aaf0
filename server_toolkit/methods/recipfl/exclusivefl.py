"""ExclusiveFL (RecipFL's baseline): two separate FedAvg federations, one per device role.

Strong devices train the large model and average it among themselves (with one strong
device this is local training); weak devices train the small model and average it among
themselves. The global weights hold both models, their tensor names prefixed ``large.``
and ``small.``; a group that sends nothing in a round keeps its weights. Central
evaluation reports ``accuracy_large``/``accuracy_small`` (``accuracy`` is the large
model's) and ``accuracy_strong``/``accuracy_weak`` (each device's own model, see
``target_accuracy``). Options (``StrongWeakOptions``, ``fedsdk-server methods show
exclusivefl``): ``small_model`` (default "width:0.25"), ``strong_tiers`` ("strong"); see
``strong_weak``.
"""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe

from ...reconstruct.average import weighted_average
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..target_accuracy import TargetAccuracy
from .strong_weak import STRONG, StrongWeakOptions, evaluate_spec, strong_weak

LARGE, SMALL = "large", "small"


def with_prefix(weights: Weights, prefix: str) -> Weights:
    return {f"{prefix}.{name}": value for name, value in weights.items()}


def without_prefix(weights: Weights, prefix: str) -> Weights:
    cut = len(prefix) + 1
    return {name[cut:]: value for name, value in weights.items() if name.startswith(prefix + ".")}


class ExclusiveFL(Method):
    name = "exclusivefl"
    asks = {"label_counts": {}}  # accuracy_strong / accuracy_weak weigh the test set by them
    family = "resource-skew"
    example = ("--model lenet5 --devices 6 --partition quantity-skew --num-strong 1 "
               "--tiers strong,weak,weak,weak,weak,weak --method-option small_model=width:0.3")
    Options = StrongWeakOptions
    options: StrongWeakOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.fleet = strong_weak(global_spec, self.options.small_model, self.options.strong_tiers)
        self.specs = {LARGE: self.fleet.large, SMALL: self.fleet.small}
        self.targets = TargetAccuracy(int(global_spec["num_classes"]))

    def model_of(self, device: DeviceInfo) -> str:
        return LARGE if self.fleet.role(device) == STRONG else SMALL

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """Strong devices run the large model, weak ones the small one."""
        model = self.model_of(device)
        return self.specs[model], without_prefix(global_weights, model)

    def initial_weights(self, seed: int) -> Weights:
        from fedcore.torch_model import build_model, state_numpy

        return {**with_prefix(state_numpy(build_model(self.specs[LARGE], seed=seed)), LARGE),
                **with_prefix(state_numpy(build_model(self.specs[SMALL], seed=seed)), SMALL)}

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.targets.see(devices, self.fleet.role)
        out = []
        for device in devices:
            model = self.model_of(device)
            out.append(TrainInstruction(device.device_id, self.specs[model],
                                        without_prefix(global_weights, model), self.recipe))
        return out

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        new = dict(global_weights)
        for model in (LARGE, SMALL):
            group = [(u.weights, u.num_samples) for u in updates if self.fleet.model_of(u.weights) == model]
            if group:
                new.update(with_prefix(weighted_average(group), model))
        return new

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        out = {}
        for model in (LARGE, SMALL):
            stats = evaluate_spec(self.specs[model], without_prefix(global_weights, model), x, y)
            out[f"accuracy_{model}"], out[f"loss_{model}"] = stats["accuracy"], stats["loss"]
        models = {model: without_prefix(global_weights, model) for model in (LARGE, SMALL)}

        def target(device: DeviceInfo, role: str) -> tuple[dict, Weights]:
            model = LARGE if role == STRONG else SMALL
            return self.specs[model], models[model]

        return {"accuracy": out["accuracy_large"], "loss": out["loss_large"], **out,
                **self.targets.evaluate(target, x, y)}

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        self.targets.report(updates)
        return super().aggregate_evaluate(round_number, updates)

    def state_dict(self) -> dict:
        return {"targets": self.targets.state()}

    def load_state_dict(self, state: dict) -> None:
        self.targets.load(state.get("targets", {}))

