"""Running one task on a device, whatever the runtimes: the steps of its plan, then what it
returns and reports (protocol v2; ``protocol.task_plan``, ``outputs``).

Shared by the device agent and the server's in-process grid, so a simulated device trains a
task exactly as a real one does:

* each step trains one model with its recipe; when the recipe's loss reads a teacher's
  outputs (``fedcore.recipe.LOSS_KINDS``), the step's teacher model first computes them
  on the local data in eval mode (``teacher_extras``), from its current weights (trained by
  an earlier step of the same task, or as sent);
* every trained model's weights go back through ``LocalTensors`` (the tensors a task left
  out stay on the device); the models the plan returns become array records holding
  exactly the tensors they were sent;
* local differential privacy: when the last step's recipe has ``dp_clip`` > 0, the model
  it trained goes back clipped and noised (``privacy.noised_delta``);
* a held-back split (``holdout`` > 0, ``sdk_device.holdout``): before any step, the model
  the device deploys (``holdout_model``, else the last step's) as received is scored on the
  held-back samples (its final output; with ``holdout_ensemble`` the mean softmax of all its
  outputs; with ``holdout_members`` together with those models of the task, as received); the
  steps and the outputs
  then see only the rest;
* metrics: ``samples``, ``loss``, ``accuracy`` of the last step, ``<model>_loss`` and
  ``<model>_accuracy`` of the others, the metric outputs asked for, then ``holdout_accuracy``,
  ``holdout_loss``, ``holdout_samples`` when a split was held back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import LOSS_KINDS, Recipe, StepStats

from .holdout import holdout_metrics, split_holdout
from .local_tensors import LocalTensors
from .outputs import OUTPUTS, OutputContext
from .privacy import noised_delta
from .protocol.task_plan import TaskPlan
from .runtimes.base import Progress

Weights = dict[str, np.ndarray]


@dataclass
class LoadedModel:
    """One model of a task on this device: the runtime holding it (weights set), its
    program's blob id (for ``LocalTensors``) and the tensors the task sent."""

    runtime: object
    program_id: str
    sent: Weights


@dataclass(frozen=True)
class TaskOutput:
    """What goes back: array records by name, and the metrics."""

    arrays: dict[str, Weights]
    metrics: dict


def teacher_extras(teacher_runtime, x: np.ndarray, recipe: Recipe) -> dict[str, np.ndarray]:
    """The per-sample arrays ``recipe``'s loss reads from a teacher: ``teacher_logits`` (N, K)
    and, for a feature term with a feature size, ``teacher_features`` (N, F)."""
    logits, features = teacher_runtime.predict(x)
    extras = {"teacher_logits": logits}
    if "teacher_features" in LOSS_KINDS[recipe.loss].reads and recipe.teacher_features:
        if features.shape[1] != recipe.teacher_features:
            raise ValueError(f"teacher has {features.shape[1]} features, the recipe says "
                             f"{recipe.teacher_features}")
        extras["teacher_features"] = features
    return extras


def run_task(plan: TaskPlan, models: dict[str, LoadedModel], x: np.ndarray, y: np.ndarray,
             local: LocalTensors, progress: Progress | None = None,
             share_features: bool = True, holdout: float = 0.0, holdout_model: str | None = None,
             holdout_ensemble: bool = False, holdout_members: tuple[str, ...] = ()) -> TaskOutput:
    """Train ``plan``'s steps on (x, y) with ``models``; returns the array records and metrics.
    ``holdout``: the fraction of (x, y) held back on which model ``holdout_model`` (None: the
    last step's) is scored before training (0: none); ``holdout_ensemble``: score the mean
    softmax of all its outputs instead of its final output; ``holdout_members``: models of the
    task whose softmax joins that mean (``sdk_device.holdout``)."""
    metrics: dict = {}
    held: dict = {}
    if holdout > 0:
        train_idx, held_idx = split_holdout(y, holdout)
        if len(held_idx):
            scored = models[holdout_model or plan.steps[-1].model]
            held = holdout_metrics(scored.runtime, x[held_idx], y[held_idx], holdout_ensemble,
                                   [models[name].runtime for name in holdout_members])
            x, y = x[train_idx], y[train_idx]
    stats = StepStats(len(y), float("nan"), 0.0)
    for i, step in enumerate(plan.steps):
        loaded = models[step.model]
        extras = None
        if step.teacher is not None and step.recipe.needs_teacher:
            extras = teacher_extras(models[step.teacher].runtime, x, step.recipe)
        part = None if progress is None else (lambda f, i=i: progress((i + f) / len(plan.steps)))
        kwargs = {"extras": extras} if extras else {}
        stats = loaded.runtime.train(x, y, step.recipe, progress=part, **kwargs)
        if i < len(plan.steps) - 1:
            metrics[f"{step.model}_loss"] = _finite(stats.loss)
            metrics[f"{step.model}_accuracy"] = stats.accuracy
    arrays = {}
    for name in sorted(plan.trained() | set(plan.returns)):
        loaded = models[name]
        kept = local.remember(loaded.program_id, loaded.sent, loaded.runtime.get_weights())
        last = plan.steps[-1]
        if name == last.model and last.recipe.dp_clip > 0:
            kept = noised_delta(loaded.sent, kept, last.recipe.dp_clip, last.recipe.dp_noise)
        if name in plan.returns:
            arrays[name] = kept
    metrics.update(samples=stats.samples, loss=_finite(stats.loss), accuracy=stats.accuracy)
    context = OutputContext(x, y, {name: m.runtime for name, m in models.items()}, plan.steps[-1].recipe.seed,
                            share_features)
    for name, params in plan.reports.items():
        output = OUTPUTS[name]
        value = output.compute(context, params)
        if value is None:
            continue
        if output.kind == "arrays":
            arrays[name] = value
        else:
            metrics[name] = value
    metrics.update(held)
    return TaskOutput(arrays, metrics)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN
