"""The method interface, in the spirit of Flower's Strategy.

A method decides *what* each device trains and *how* results become the new global
model; it never touches MQTT, blobs or the registry (the round loop and its grid do). Four small
methods: ``configure_train``, ``aggregate_train``, ``evaluate`` (central, on server-held
test data) and ``aggregate_evaluate`` (the devices' own reported metrics).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from fedcore.recipe import Recipe
from sdk_device.protocol.task_plan import TaskPlan, TrainStep

from .capability import EDGES, WeightedSum, why_not
from .options import MethodOptions
from .summands import NotASum, Summand

Weights = dict[str, np.ndarray]
MODEL = "model"  # the name of the model a task trains (its last step)


@dataclass(frozen=True)
class DeviceInfo:
    """What the server knows of a selected device (never its data). ``tier``: resolved once,
    before any method sees the device (fleet tier, else the profile's, then the run's
    ``tier_map``; ``methods/tiers.py``); methods read it and nothing else."""

    device_id: str
    num_samples: int
    tier: str | None = None
    runtimes: tuple[str, ...] = ("torch",)
    profile: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRecord:
    """A model of a task besides the one it trains (e.g. a teacher): its spec and weights.
    ``programs``: ready-made ``(format, bytes)`` programs to offer as they are (an edge
    forwards its server's); empty: the MQTT grid offers the spec (``torchspec/1``)."""

    spec: dict
    weights: Weights
    programs: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class TrainInstruction:
    """What one device is asked to do (a protocol v2 task, ``sdk_device.protocol.task_plan``):
    train ``weights`` of model ``spec`` (the task's model ``"model"``) by ``recipe``.

    ``weights`` may leave out tensors the device keeps to itself (e.g. BatchNorm running
    statistics); what comes back holds exactly the names sent.
    ``context``: the method's own per-instruction decisions (JSON values only, e.g. a width
    ratio and window offsets, an exit tier, a stage), read back at aggregation from
    ``ClientUpdate.instruction``; persisted with the task, so a restarted server aggregates
    what it sent without planning the round again. Derived data (index arrays) is rebuilt
    from it, never stored in it.

    Generic records, for methods that need more than one model (``methods/records.py`` has
    the helpers): ``models`` = the task's other models by name; ``steps_before`` = steps
    that train some of them first; ``teacher`` = the model whose outputs ``recipe``'s loss
    reads; ``returns`` = the models whose trained weights come back; ``reports`` = extra
    outputs asked of the device (``sdk_device.outputs``: ``label_counts``, ``features``).
    ``programs``: ready-made ``(format, bytes)`` programs of ``"model"`` (an edge forwards
    its server's); empty: the MQTT grid exports them from ``spec``. ``holdout``: the fraction
    of its samples the device holds back and scores the received model on before training
    (``task.holdout``, ``sdk_device.holdout``; 0: none), set by the round loop from
    ``--holdout``, not by methods. ``deploys``: the model of the task this device can deploy,
    the one it scores on that split (``task.holdout_model``; RecipFL's strong devices: the
    teacher, their large model); default ``"model"``. ``holdout_ensemble``: the device scores
    the mean softmax of all that model's outputs, not its final one (``task.holdout_ensemble``),
    set by the round loop with ``holdout`` for a method that ``deploys_ensemble`` (DepthFL).
    ``holdout_members``: models of the task whose softmax joins the deployed one's in that score
    (``task.holdout_members``; set by the round loop with ``holdout`` from ``Method.holdout_members``).
    """

    device_id: str
    spec: dict
    weights: Weights
    recipe: Recipe
    context: dict = field(default_factory=dict)
    models: dict[str, ModelRecord] = field(default_factory=dict)
    steps_before: tuple[TrainStep, ...] = ()
    teacher: str | None = None
    returns: tuple[str, ...] = (MODEL,)
    reports: dict[str, dict] = field(default_factory=dict)
    programs: tuple[tuple[str, bytes], ...] = ()
    holdout: float = 0.0
    deploys: str = MODEL
    holdout_ensemble: bool = False
    holdout_members: tuple[str, ...] = ()

    def plan(self) -> TaskPlan:
        """The task's plan: ``steps_before``, then ``"model"`` by ``recipe``; a bundle's
        (``context["edge"] == "updates"``, ``edge/bundle.py``) also names its members."""
        members = {name: {"device": m["device"], "recipe": m["recipe"]}
                   for name, m in self.context.get("members", {}).items()} \
            if self.context.get("edge") == "updates" else {}
        return TaskPlan((*self.steps_before, TrainStep(MODEL, self.recipe, self.teacher)), self.returns,
                        self.reports, members)

    def all_models(self) -> dict[str, ModelRecord]:
        """Every model of the task by name, ``"model"`` first."""
        return {MODEL: ModelRecord(self.spec, self.weights, self.programs), **self.models}


@dataclass(frozen=True)
class ClientUpdate:
    """An accepted result: the weights of ``"model"`` a device returned (same names and
    shapes as sent), its metrics, the instruction it answered, and its other array records
    by name (a returned teacher's weights, the ``features`` it was asked for)."""

    device_id: str
    num_samples: int
    weights: Weights
    metrics: dict
    instruction: TrainInstruction
    others: dict[str, Weights] = field(default_factory=dict)

    @property
    def arrays(self) -> dict[str, Weights]:
        """Every returned array record by name, ``"model"`` included."""
        return {MODEL: self.weights, **self.others}


def label_histogram(counts: object, num_classes: int) -> np.ndarray | None:
    """A device's reported ``label_counts`` as a ``(num_classes,)`` float64 histogram, padded
    with zeros (a device counts up to its own largest label only). None when absent or not a
    list of at most ``num_classes`` finite counts >= 0 (a device's report is never trusted)."""
    if not isinstance(counts, list | tuple | np.ndarray) or len(counts) > num_classes:
        return None
    try:
        values = np.asarray(counts, np.float64)
    except (TypeError, ValueError):
        return None
    if values.ndim != 1 or not np.isfinite(values).all() or (values < 0).any():
        return None
    return np.pad(values, (0, num_classes - len(values)))


class Method(ABC):
    """A federated method. Subclasses set ``name`` and implement the two train methods.

    ``global_spec`` is the server's model (torchspec/1), ``recipe`` the devices' default
    training recipe; method-specific keyword options are declared by the method's ``Options``
    dataclass (``methods/options.py``) and parsed here into ``self.options``, once.

    Server data: a method that tunes something on labelled data of its own sets
    ``server_fraction`` > 0; whoever runs it (simulation, ``fedsdk-server run``, benches)
    then cuts that share of the training set off before partitioning (``data/server_slice.py``)
    and hands it over with ``attach_server_data`` before ``initial_weights``.
    """

    name: str = ""
    family: str = ""  # what kind of method: averaging, width, exit, conv, personalised, resource-skew
    example: str = ""  # `fedsdk-server simulate --method NAME <example>`: arguments it is shown with
    asks: dict[str, dict] = {}  # outputs every task asks devices for (``sdk_device.outputs``)
    server_fraction: float = 0.0  # share of the training data the server keeps (0: none)
    bounds_updates: bool = True  # the round loop clips outsized update deltas (rounds/norm_bound.py)
    weighted_sum: WeightedSum | None = None
    """The capability every feature reads (``methods/capability.py``): set, the aggregate is a
    weighted mean of per-element contributions, ``summands`` gives them, and edges, ``--mode
    async``, DP / robust aggregation and ``--secagg`` serve the method as the declaration says;
    None: it is not, and they refuse it."""
    not_a_sum: str = ""
    """Why the aggregate is not a weighted sum (one clause, for the features' refusals; "": generic)."""
    bundles: bool = True
    """A bundle edge can relay its tasks to the edge's members (``edge/bundle.py``: one model per
    member); False (tasks of several models, HeteroFL's ``also_narrowest``): edges refuse it."""
    classifiers: tuple[str, ...] | list[str] = ()
    """Global tensors whose rows are classes, weighted per class (``present`` layout; DepthFL)."""
    ignores_tiers: bool = False
    """One model for every device: ``--tiers`` has no effect and only warns (``cli/run_checks.py``)."""
    folds_edges: bool = False
    """``configure_train`` / ``aggregate_train`` handle the group's edge aggregators themselves, so
    the round loop passes their tasks and partials through (``edge/fold.py``, ``edge/bundle.py``)."""
    stamped: bool = False
    """Its tasks carry recipes the server already stamped (seeds, DP): the round loop keeps them
    (an edge's bundle relay, ``rounds/loop.py``)."""
    per_device_models: bool = False
    """Each device deploys a model of its own (personalised methods): a tier's accuracy is the
    mean over its devices (``methods/tier_accuracy.py``); False: one model per tier."""
    deploys_ensemble: bool = False
    """The deployable model predicts with the mean of the softmax of all its outputs (exits
    and final; DepthFL's ensemble inference), ``methods/tier_accuracy.py``; False: its final output."""
    server_data: tuple[np.ndarray, np.ndarray] | None = None
    Options: type[MethodOptions] = MethodOptions  # the method's options (a frozen dataclass)

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        self.options = self.Options.parse(self.name, options)
        self.global_spec = global_spec
        self.recipe = recipe

    def attach_server_data(self, x: np.ndarray, y: np.ndarray) -> None:
        """Give the method its server-held training data: x (N, C, H, W) float32, y (N,) int64."""
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"server data needs as many labels as samples (> 0), got {len(x)}, {len(y)}")
        self.server_data = (np.ascontiguousarray(x, np.float32), np.asarray(y, np.int64))

    def initial_weights(self, seed: int) -> Weights:
        """Fresh global weights for round 1 (seeded)."""
        from fedcore.torch_model import build_model, state_numpy

        return state_numpy(build_model(self.global_spec, seed=seed))

    def tier_plan(self, tier: str | None) -> tuple[dict, Recipe]:
        """The spec and recipe a device of ``tier`` trains (None: the largest), for sizing
        tiers at pairing. Default: every tier trains the global model."""
        return self.global_spec, self.recipe

    @abstractmethod
    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        """One instruction per selected device."""

    @abstractmethod
    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        """The next global weights from this round's accepted updates (at least one)."""

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        """Central evaluation of the global model (final output) on server-held data."""
        from fedcore.torch_model import build_model, load_numpy
        from fedcore.torch_train import evaluate_model

        model = build_model(self.global_spec)
        load_numpy(model, global_weights)
        stats = evaluate_model(model, x, y)
        return {"accuracy": stats.accuracy, "loss": stats.loss}

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights] | None:
        """(spec, weights) of the model ``device`` can run now, given ``global_weights``: what
        its tier deploys (``methods/tier_accuracy.py``); None when it has none yet. ``weights``
        may leave out BatchNorm running statistics a device keeps. Default: the global model."""
        return self.global_spec, global_weights

    def deployable_members(self, global_weights: Weights,
                           device: DeviceInfo) -> list[tuple[dict, Weights]] | None:
        """The models ``device``'s tier predicts with together, on the mean of their softmax
        outputs (``methods/tier_accuracy.py``); None when it has none yet. Default: ``deployable``
        alone (a width method with ``deploy="nested"`` adds the fleet's narrower windows)."""
        found = self.deployable(global_weights, device)
        return None if found is None else [found]

    def holdout_members(self, global_weights: Weights, device: DeviceInfo,
                        instruction: TrainInstruction) -> tuple[dict[str, ModelRecord], tuple[str, ...]]:
        """(extra models to add to ``instruction``, names of the task's models the device scores
        beside ``instruction.deploys`` on its held-back split) so that score is of what its tier
        deploys (``methods/holdout_members.py``); the round loop asks only with ``holdout`` > 0.
        Default: none (the deployed model alone)."""
        return {}, ()

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        """Sample-weighted mean of the devices' reported training loss and accuracy."""
        total = sum(u.num_samples for u in updates) or 1
        out = {}
        for key in ("loss", "accuracy"):
            values = [(u.metrics.get(key), u.num_samples) for u in updates]
            if values and all(isinstance(v, int | float) for v, _ in values):
                out[f"device_{key}"] = sum(v * n for v, n in values) / total
        return out

    def summands(self, global_weights: Weights, update: ClientUpdate) -> dict[str, Summand]:
        """``update``'s share of the aggregate, per global tensor (``methods/summands.py``);
        methods that declare ``weighted_sum`` implement it."""
        raise NotASum(f"{self.name or type(self).__name__}: {why_not(self, EDGES)}")

    def state_dict(self) -> dict:
        """JSON-ready method state saved with each checkpoint (for ``--resume``)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - stateless methods need nothing
        """Restore what ``state_dict`` returned."""
