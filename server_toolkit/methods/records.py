"""Generic task records for methods that need more than one model or extra outputs
(protocol v2: a task = named models + steps + the models returned + outputs reported).

``with_teacher`` adds a teacher model to a task (trained first and returned, or frozen);
``asking`` asks the device for extra outputs from its registry (``sdk_device.outputs``):
``label_counts`` (a metric) or ``features`` (an array record, FedConv's smashed data).
The device resolves loss kinds and outputs from its own registries; nothing here is
method-specific on the wire.
"""

from __future__ import annotations

import dataclasses

from fedcore.recipe import Recipe
from sdk_device.protocol.task_plan import TrainStep

from .base import ModelRecord, TrainInstruction, Weights

TEACHER = "teacher"
LABEL_COUNTS = "label_counts"
FEATURES = "features"
COVERAGE = "coverage"  # an edge's partial aggregate: the weight A per element (edge/partial.py)


def with_teacher(instruction: TrainInstruction, spec: dict, weights: Weights,
                 train_first: Recipe | None = None, returned: bool = False) -> TrainInstruction:
    """``instruction`` whose model learns from a teacher (``spec``, ``weights``): the
    instruction's recipe must name a loss that reads a teacher (e.g. ``kd``). ``train_first``:
    the device first trains the teacher by this recipe (e.g. CE); ``returned``: the teacher's
    trained weights come back (``ClientUpdate.others["teacher"]``)."""
    steps = (TrainStep(TEACHER, train_first),) if train_first is not None else ()
    returns = (*instruction.returns, TEACHER) if returned else instruction.returns
    models = {**instruction.models, TEACHER: ModelRecord(spec, weights)}
    return dataclasses.replace(instruction, models=models, steps_before=(*instruction.steps_before, *steps),
                               teacher=TEACHER, returns=returns)


def asking(instruction: TrainInstruction, **reports: dict) -> TrainInstruction:
    """``instruction`` that also asks for these outputs, e.g. ``asking(i, label_counts={})``
    or ``asking(i, features={"samples": 128})``."""
    return dataclasses.replace(instruction, reports={**instruction.reports, **reports})
