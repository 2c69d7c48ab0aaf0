"""What a task asks a device to do: its config record, parsed and checked (protocol v2).

A task names models (each a program list and an array record of its weights, under the
same name, e.g. ``"model"``, ``"teacher"``) and a config record::

    {"steps":  [{"train": "teacher", "recipe": {...}},
                {"train": "model", "recipe": {...}, "teacher": "teacher"}],
     "return": ["model", "teacher"],
     "report": {"label_counts": {}, "features": {"model": "model", "samples": 128}}}

* ``steps``: trained in order; each trains one model by its recipe; a recipe whose loss
  reads a teacher's outputs (``fedcore.recipe.LOSS_KINDS``) names the model giving them;
* ``return``: the models whose trained weights come back, each as an array record of that
  name holding exactly the tensors it was sent;
* ``report``: extra outputs, by name from the device's output registry
  (``sdk_device.outputs``): a metric (``label_counts``) or an array record (``features``);
* ``members`` (bundle tasks only, sent to edge aggregators: docs/protocol.md "Bundle
  tasks"): per model name, the group device that trains it and its recipe. A device refuses
  a bundle with ``unsupported_task``; an edge parses it with ``bundles=True``.

``parse_plan`` is what a device runs on a received config; ``plan_config`` is the inverse
the server uses to write one. Both sides therefore agree by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fedcore.recipe import Recipe

from .errors import ProtocolError

NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_STEPS = 8
MAX_REPORTS = 8


@dataclass(frozen=True)
class TrainStep:
    """Train model ``model`` by ``recipe``; ``teacher``: the model whose outputs the loss reads."""

    model: str
    recipe: Recipe
    teacher: str | None = None


@dataclass(frozen=True)
class TaskPlan:
    """A task's steps, the models it returns and the extra outputs it asks for."""

    steps: tuple[TrainStep, ...]
    returns: tuple[str, ...] = ("model",)
    reports: dict[str, dict] = field(default_factory=dict)
    members: dict[str, dict] = field(default_factory=dict)  # bundle: model -> {"device", "recipe"}

    def trained(self) -> set[str]:
        return {s.model for s in self.steps}

    def teachers(self) -> set[str]:
        """Models some step reads outputs from (a device runs them where it can predict)."""
        return {s.teacher for s in self.steps if s.teacher}


def check_name(what: str, name: object) -> str:
    """A model or output name: lowercase letters, digits, underscores, at most 32."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ProtocolError("invalid_field", f"{what} {name!r} must match {NAME.pattern}")
    return name


def parse_plan(config: dict, models: set[str], known_reports: set[str], bundles: bool = False) -> TaskPlan:
    """The plan of a task's config record. ``models``: the names the task has both programs
    and an array record for; ``known_reports``: the outputs this device can produce;
    ``bundles``: this is an edge aggregator, which accepts bundle tasks (``members``).
    ProtocolError ``invalid_field`` for a malformed config, ``unsupported_task`` for a
    report this device does not know or a bundle sent to a device."""
    if not isinstance(config, dict):
        raise ProtocolError("invalid_field", "task.config must be an object")
    if "members" in config and not bundles:
        raise ProtocolError("unsupported_task", "a bundle task (task.config.members) is for edge aggregators")
    unknown = sorted(set(config) - {"steps", "return", "report", "members"})
    if unknown:
        raise ProtocolError("invalid_field", f"task.config has unknown keys {unknown}")
    steps = config.get("steps")
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise ProtocolError("invalid_field", f"task.config.steps must list 1..{MAX_STEPS} steps")
    plan_steps = tuple(_parse_step(step, i, models) for i, step in enumerate(steps))
    returns = config.get("return", ["model"])
    if not isinstance(returns, list) or len(set(returns)) != len(returns):
        raise ProtocolError("invalid_field", "task.config.return must be a list of distinct model names")
    for name in returns:
        if check_name("returned model", name) not in models:
            raise ProtocolError("invalid_field", f"task.config.return names {name!r}, which the task lacks")
    reports = config.get("report", {})
    if not isinstance(reports, dict) or len(reports) > MAX_REPORTS:
        raise ProtocolError("invalid_field", f"task.config.report must be an object of at most {MAX_REPORTS}")
    for name, params in reports.items():
        check_name("report", name)
        if not isinstance(params, dict):
            raise ProtocolError("invalid_field", f"task.config.report.{name} must be an object")
        if name not in known_reports:
            raise ProtocolError("unsupported_task", f"this device cannot report {name!r}")
    members = _parse_members(config.get("members", {}), models, returns)
    return TaskPlan(plan_steps, tuple(returns), dict(reports), members)


def _parse_members(members: object, models: set[str], returns: list[str]) -> dict[str, dict]:
    """A bundle's ``members``: {model name: {"device": id, "recipe": {...}}}, each model one
    the task has and returns; the recipe is checked (``invalid_field`` otherwise)."""
    if not isinstance(members, dict):
        raise ProtocolError("invalid_field", "task.config.members must be an object")
    out = {}
    for name, entry in members.items():
        check_name("bundle member model", name)
        if name not in models or name not in returns or name == "model":
            raise ProtocolError("invalid_field", f"task.config.members.{name} must name a returned model "
                                                 f"other than 'model'")
        if not isinstance(entry, dict) or set(entry) != {"device", "recipe"} \
                or not isinstance(entry["device"], str) or not isinstance(entry["recipe"], dict):
            raise ProtocolError("invalid_field", f"task.config.members.{name} must be {{device, recipe}}")
        try:
            Recipe.from_dict(entry["recipe"])
        except ValueError as exc:
            raise ProtocolError("invalid_field", f"task.config.members.{name}.recipe: {exc}") from None
        out[name] = {"device": entry["device"], "recipe": dict(entry["recipe"])}
    if len({m["device"] for m in out.values()}) != len(out):
        raise ProtocolError("invalid_field", "task.config.members names a device twice")
    return out


def _parse_step(step: object, index: int, models: set[str]) -> TrainStep:
    where = f"task.config.steps[{index}]"
    if not isinstance(step, dict) or not set(step) <= {"train", "recipe", "teacher"}:
        raise ProtocolError("invalid_field", f"{where} must be an object with train, recipe (, teacher)")
    model = check_name(f"{where}.train", step.get("train"))
    if model not in models:
        raise ProtocolError("invalid_field", f"{where} trains {model!r}, which the task lacks")
    try:
        recipe = Recipe.from_dict(step.get("recipe") if isinstance(step.get("recipe"), dict) else {})
    except ValueError as exc:
        raise ProtocolError("invalid_field", f"{where}.recipe: {exc}") from None
    teacher = step.get("teacher")
    if teacher is not None:
        check_name(f"{where}.teacher", teacher)
        if teacher not in models or teacher == model:
            raise ProtocolError("invalid_field", f"{where}.teacher must name another model of the task")
    if recipe.needs_teacher and teacher is None:
        raise ProtocolError("invalid_field", f"{where}: loss {recipe.loss!r} needs a teacher model")
    return TrainStep(model, recipe, teacher)


def plan_config(plan: TaskPlan) -> dict:
    """The config record of ``plan`` (what ``parse_plan`` reads back)."""
    steps = []
    for step in plan.steps:
        entry: dict = {"train": step.model, "recipe": step.recipe.to_dict()}
        if step.teacher:
            entry["teacher"] = step.teacher
        steps.append(entry)
    reports = {name: dict(params) for name, params in plan.reports.items()}
    config = {"steps": steps, "return": list(plan.returns), "report": reports}
    if plan.members:
        config["members"] = {name: dict(entry) for name, entry in plan.members.items()}
    return config
