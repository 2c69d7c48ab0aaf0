"""DepthFL (Kim et al., ICLR 2023): depth split with mutual self-distillation and ensemble inference.

Tier ``t`` trains the prefix of the multi-exit global model through exit ``t``
(``submodels.exit_split``). The device's loss (``self_distillation``, default on) is the
recipe loss ``depthfl_sd`` (``fedcore.losses``): the sum of CE over its exits plus, for
every ordered pair of its exits i != j, ``sd_weight`` * T^2 / (n - 1) * KL(p_j || p_i) with
p_j detached, T = ``sd_temperature``; a tier with one exit has no pair and gets plain ``ce``
(the same maths, and a program an ORT device can run). Decision (the paper's text gives no
temperature or weight): T = 1 and weight 1, the published reproductions' values.
``self_distillation=false`` is the ablation: the unweighted CE sum, HypeMeFed's "multi-exit,
no HN" (HypeMeFed, a subclass, never distils). ONNX Runtime devices cannot train
``depthfl_sd`` (the ORT export refuses it: ONNX has no stop-gradient).

Ensemble inference (``ensemble``, default on): a tier's deployable model predicts with the
mean of the softmax of all the exits it has (``Method.deploys_ensemble``), and
``accuracy_tier_<t>`` scores that. Decision: the ensemble, not the tier's best exit: a
device cannot pick its best exit without labels, and picking it on the test set would
score the choice on the data it was chosen with. ``accuracy_ensemble`` adds the global
model's ensemble over all exits (the paper's reported global accuracy); ``accuracy`` stays
the final exit.
Aggregation: every global tensor is the sample-weighted mean over the clients that trained
it; tensors nobody trained this round keep their value (``reconstruct.present_average``).
Exception (``classwise_heads``, default on): each exit's classifier is averaged per class,
row ``c`` over the clients weighted by their samples of class ``c`` as their results report
them (``label_counts``; a client that reports none counts with its sample count for every
class), rows of classes no participant has keep their value (``methods.exit.classwise_average``).

Decision (classifier rows, a departure from plain FedAvg; measured on digits, Dirichlet 0.1,
27 clients, 5 per round, 30 rounds, seeds 0 / 1): the final exit is trained only by the
round's tier-3 clients, 0-4 of them (1.7 on average) holding 1-3 classes each; the plain
average made the global final exit predict mostly the classes of the last round's deep
clients (0.100 / 0.201 accuracy plateaus = one or two classes) and ended at 0.49 / 0.43
(last-5 mean). Per-class rows: 0.80 / 0.62. The same rule on FedAvg-S, whose single exit
all five clients train, moved it by +0.4 / +0.9 points only.

Client recipe (HypeMeFed's table): Adam, lr ``client_lr`` (default 5e-4), batch
``client_batch_size`` (default 16); epochs, weight decay and seed come from the user's
recipe. ``user_recipe=true`` hands out the user's recipe unchanged. Every option, its type
and default: ``fedsdk-server methods show depthfl``.

Decision (learning rate): 5e-4 is the paper's value for the model we train (the VGG
32-64-128-256 is its SVHN model; 0.005 was its value for UniMiB's wider VGG). Measured with
0.005 (digits, 5 local epochs on ~40 samples): one round moved the deep convs by 0.6-1.3x
their own norm (5e-4: 0.06-0.13x), and at Dirichlet 0.1 every method training the deep
model collapsed (30 rounds, last-5 final-exit accuracy, seed 0: FedAvg-L 0.51 -> 0.85,
multi-exit 0.18 -> 0.49 with 5e-4; FedAvg-S 0.89 -> 0.94; at alpha 0.5 FedAvg-S 0.97 both).
The batch stays 16 (the paper's SVHN batch of 128 exceeds a client's ~40 samples).

Tiers: a device's tier is the number of exits it trains ("1", "2", ...; none: all), or a
name listed in the ``tier_exits`` option ({tier name: exit count}).

As RecipFL's depth-scaled baseline: ``--model lenet5_multi_exit --tiers strong,weak,...
--method-option tier_exits={"strong":2,"weak":1} --method-option user_recipe=true`` (the weak
devices train LeNet-5's conv trunk and the exit after it; every arm of the comparison trains
with the same recipe).

Evaluation: the global model's final exit gives ``accuracy``/``loss`` (as the paper
reports); ``accuracy_exit<i>`` adds every exit's accuracy on the same data. With tiers named
``strong`` and ``weak``, also ``accuracy_strong`` / ``accuracy_weak``: each device's prefix,
scored at its last exit on the test set re-weighted to its labels (``target_accuracy``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ...models.exit_eval import ensemble_accuracy, exit_accuracies
from ...reconstruct.present_average import average_present
from ...submodels.exit_split import (
    ExitSplit,
    classifier_tensors,
    name_map,
    parse_tier,
    prefix_spec,
)
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights, label_histogram
from ..capability import PRESENT, WeightedSum
from ..options import MethodOptions, option
from ..summands import Summand, whole
from ..target_accuracy import TargetAccuracy, role_by_tier_name
from .classwise_average import classwise_average

CLIENT_LR = 5e-4  # the paper's Adam lr for its VGG 32-64-128-256 (see the module docstring)
CLIENT_BATCH_SIZE = 16


@dataclass(frozen=True)
class ExitOptions(MethodOptions):
    """The device recipe of every exit-split method (HypeMeFed's table)."""

    client_lr: float = option(CLIENT_LR, "Devices' Adam learning rate (ignored with user_recipe).",
                              minimum=0.0)
    client_batch_size: int = option(CLIENT_BATCH_SIZE, "Devices' batch size in samples (ignored with "
                                    "user_recipe).", minimum=1)
    user_recipe: bool = option(False, "Hand out the user's recipe unchanged instead of Adam, client_lr and "
                               "client_batch_size.")


@dataclass(frozen=True)
class MultiExitOptions(ExitOptions):
    """Exit-split methods that train prefixes of a multi-exit model (DepthFL, HypeMeFed)."""

    classwise_heads: bool = option(True, "Average each exit's classifier rows per class, weighted by the "
                                   "devices' reported label counts (false: by sample counts).")


@dataclass(frozen=True)
class DepthFLOptions(MultiExitOptions):
    tier_exits: dict[str, int] = option({}, "Exit count each named tier trains, {tier name: exits} (other "
                                        "tiers are exit counts themselves).")
    self_distillation: bool = option(True, "Train with DepthFL's mutual self-distillation between a device's "
                                     "exits (recipe loss depthfl_sd); false: the plain CE sum (ablation).")
    sd_temperature: float = option(1.0, "Softmax temperature T (> 0) of the self-distillation KL terms.",
                                   minimum=0.0)
    sd_weight: float = option(1.0, "Weight (0..1) of the self-distillation term against the CE sum.",
                              minimum=0.0)
    ensemble: bool = option(True, "Score each tier's deployable model on the mean softmax of its exits "
                            "(false: on its last exit).")


def exit_split_recipe(recipe: Recipe, options: ExitOptions) -> Recipe:
    """The recipe devices get: the user's, or the user's with Adam, ``client_lr``, ``client_batch_size``."""
    if options.user_recipe:
        return recipe
    return dataclasses.replace(recipe, optimizer="adam", lr=options.client_lr,
                               batch_size=options.client_batch_size)


class DepthFL(Method):
    """Exit-split sub-models, plain averaging of the layers each client has."""

    name = "depthfl"
    family = "exit"
    example = "--model vgg_multi_exit --tiers 1,2,3"
    asks = {"label_counts": {}}  # the per-class weights of the classifier rows
    weighted_sum = WeightedSum(PRESENT)  # per tensor present (classifier rows per class): a weighted mean
    Options = DepthFLOptions
    options: MultiExitOptions  # DepthFLOptions; HypeMeFed's (no tier_exits) in the subclass

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.client_recipe = exit_split_recipe(recipe, self.options)
        self.sd_recipe = self.client_recipe
        if getattr(self.options, "self_distillation", False):  # HypeMeFed's options have none
            o = self.options
            if not (o.sd_temperature > 0 and o.sd_weight <= 1):
                raise ValueError(f"depthfl needs sd_temperature > 0 and sd_weight <= 1 "
                                 f"(got {o.sd_temperature}, {o.sd_weight})")
            self.sd_recipe = dataclasses.replace(self.client_recipe, loss="depthfl_sd",
                                                 temperature=o.sd_temperature, alpha=o.sd_weight)
        self.deploys_ensemble = bool(getattr(self.options, "ensemble", False))
        self.planner = ExitSplit()
        self.classifiers = classifier_tensors(global_spec) if self.options.classwise_heads else []
        tier_exits = getattr(self.options, "tier_exits", {})  # HypeMeFed's tiers are exit counts only
        self.tier_exits = {str(k): str(v) for k, v in tier_exits.items()}
        for exits in self.tier_exits.values():
            parse_tier(exits, global_spec)  # a bad count fails now, not in round 1
        self.targets = TargetAccuracy(int(global_spec["num_classes"]))

    def exits_of(self, tier: str | None) -> str | None:
        """The exit count a tier trains (``tier_exits`` maps names to counts; None: all)."""
        return self.tier_exits.get(tier, tier) if tier is not None else None

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.targets.see(devices, role_by_tier_name)
        instructions = []
        for device in devices:
            exits = self.exits_of(device.tier)
            sub = self.planner.plan(self.global_spec, global_weights, exits, round_number)
            tier = sub.index_map["tier"]
            instructions.append(TrainInstruction(device.device_id, sub.spec, sub.weights,
                                                 self.recipe_for(tier), {"tier": tier}))
        return instructions

    def recipe_for(self, exits: int) -> Recipe:
        """The recipe of a prefix with ``exits`` outputs: self-distillation needs two or more."""
        return self.sd_recipe if exits >= 2 else self.client_recipe

    def tier_plan(self, tier: str | None) -> tuple[dict, Recipe]:
        exits = parse_tier(self.exits_of(tier), self.global_spec)
        return prefix_spec(self.global_spec, exits), self.recipe_for(exits)

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """The depth prefix through the tier's last exit (scored on its exits' ensemble with
        ``ensemble``, else at its last exit)."""
        sub = self.planner.plan(self.global_spec, global_weights, self.exits_of(device.tier), 0)
        return sub.spec, sub.weights

    def client_tensors(self, global_weights: Weights, update: ClientUpdate) -> tuple[int, Weights]:
        """(tier, the update's tensors under their global names); the tier is the
        instruction's ``context["tier"]``."""
        tier = int(update.instruction.context["tier"])
        mapping = self.global_names(global_weights, update.instruction)
        return tier, {mapping[sub]: value for sub, value in update.weights.items()}

    def global_names(self, global_weights: Weights, instruction: TrainInstruction) -> dict[str, str]:
        """The global name of each tensor ``instruction``'s depth prefix returns (``present`` layout)."""
        return name_map(self.global_spec, int(instruction.context["tier"]), list(global_weights))

    def class_counts(self, update: ClientUpdate) -> np.ndarray:
        """The update's training samples per class (its ``label_counts``); without a usable
        report, its sample count for every class."""
        classes = self.global_spec["num_classes"]
        counts = label_histogram(update.metrics.get("label_counts"), classes)
        return np.full(classes, float(update.num_samples)) if counts is None else counts

    def average(self, global_weights: Weights, contributions: list[tuple[Weights, ClientUpdate]]) -> Weights:
        """The new global weights from ``(global-named tensors, update)`` pairs: sample-weighted
        means of the tensors present, classifier rows per class (see the module docstring)."""
        out = average_present(global_weights, [(t, float(u.num_samples)) for t, u in contributions])
        if self.classifiers:
            counted = [(tensors, self.class_counts(update)) for tensors, update in contributions]
            out.update(classwise_average(global_weights, counted, self.classifiers))
        return out

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        return self.average(global_weights, [(self.client_tensors(global_weights, u)[1], u) for u in updates])

    def summands(self, global_weights: Weights, update: ClientUpdate) -> dict[str, Summand]:
        """Tensors under their global names, weighted by samples; classifier rows (with
        ``classwise_heads``) by the samples of their class."""
        _, tensors = self.client_tensors(global_weights, update)
        out = whole(tensors, update.num_samples)
        if self.classifiers:
            counts = self.class_counts(update)
            for name in self.classifiers:
                if name in tensors:
                    rows = counts.reshape(-1, *[1] * (tensors[name].ndim - 1))
                    out[name] = Summand(tensors[name], (), rows)
        return out

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        self.targets.report(updates)
        return super().aggregate_evaluate(round_number, updates)

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        out = super().evaluate(global_weights, x, y)
        for i, accuracy in enumerate(exit_accuracies(self.global_spec, global_weights, x, y), start=1):
            out[f"accuracy_exit{i}"] = accuracy
        if self.deploys_ensemble:
            out["accuracy_ensemble"] = ensemble_accuracy(self.global_spec, global_weights, x, y)

        def target(device: DeviceInfo, role: str) -> tuple[dict, Weights]:
            sub = self.planner.plan(self.global_spec, global_weights, self.exits_of(device.tier), 0)
            return sub.spec, sub.weights

        return {**out, **self.targets.evaluate(target, x, y)}

    def state_dict(self) -> dict:
        return {"targets": self.targets.state()}

    def load_state_dict(self, state: dict) -> None:
        self.targets.load(state.get("targets", {}))
