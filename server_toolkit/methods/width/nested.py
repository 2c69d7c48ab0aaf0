"""HeteroFL's ``also_narrowest`` task: a wide device trains the narrowest window too, in one task.

A device whose window is wider than the narrowest ratio r_min gets a two-model task (protocol
v2, docs/protocol.md §5.5-5.6, §14.4): first ``"narrow"``, the width-r_min window at offset 0
trained by the recipe as it stands (the step every device of AllSmall runs), then ``"model"``,
its own window; both come back (``ClientUpdate.others["narrow"]``). With ``kd_alpha`` > 0 the
wide step distils from the freshly trained narrow model (loss ``kd``, temperature 1, that
alpha; §14.3), or with ``kd_teacher="global"`` from the narrow model as received (the fleet's,
frozen: a third model ``"teacher"`` of 1/64 of the full one's weights at r_min 0.125). The
narrow window's plan is kept in the instruction's context under ``"narrow"``, so the
aggregate is rebuilt from what was sent.

Cost (a wide device, per round): the narrow step's compute and memory are about
(r_min / r)² of its own window's (weights and conv activations scale with the square of the
width): 1/64 for a full device at r_min 0.125, 1/16 for a 0.5 device; its bytes down and up
grow by the narrow model's weights (lenet5 at 0.125: 1,139 parameters beside 61,706).

With HeteroFL's ``also_nested``, a device also trains every fleet window between r_min and its
own ratio, each one more model of the task (``"nested_1"``, ``"nested_2"``, ... from the
narrowest up; trained after ``"narrow"`` and before ``"model"``, all returned; each plan's
context kept under its name). A full device at tiers 1.0 / 0.5 / 0.125 then trains
1 + 1/4 + 1/64 of its window's compute a round.

Decision: the narrow model is offered as ``torchspec/1`` only (the MQTT grid exports programs
for ``"model"`` alone, as for RecipFL's teacher), so a device without the torch runtime gets
its own window only and adds no narrow model that round.
"""

from __future__ import annotations

import dataclasses

from sdk_device.protocol.task_plan import TrainStep

from ...submodels.width import IndexMap, WidthPlan
from ..base import MODEL, ClientUpdate, ModelRecord, TrainInstruction, Weights
from ..records import TEACHER

NARROW = "narrow"


def with_narrow(instruction: TrainInstruction, plan: WidthPlan, weights: Weights,
                kd_alpha: float = 0.0, kd_teacher: str = "trained") -> TrainInstruction:
    """``instruction`` (a wide window's) that first trains the narrow window ``plan`` from
    ``weights`` by the instruction's recipe and returns it beside ``"model"``; ``kd_alpha`` > 0:
    ``"model"`` distils (``kd``, temperature 1) from the device's freshly trained narrow model
    (``kd_teacher="trained"``) or from the narrow model as received, the fleet's, frozen
    (``"global"``: a third model ``"teacher"``, neither trained nor returned)."""
    recipe = instruction.recipe
    models = {**instruction.models, NARROW: ModelRecord(plan.spec, weights)}
    teacher, recipe_wide = None, recipe
    if kd_alpha > 0:
        recipe_wide = dataclasses.replace(recipe, loss="kd", alpha=float(kd_alpha), temperature=1.0)
        teacher = NARROW if kd_teacher == "trained" else TEACHER
        if teacher == TEACHER:
            models[TEACHER] = ModelRecord(plan.spec, weights)
    return dataclasses.replace(
        instruction, recipe=recipe_wide, context={**instruction.context, NARROW: plan.context()},
        models=models, steps_before=(*instruction.steps_before, TrainStep(NARROW, recipe)),
        teacher=teacher, returns=(MODEL, NARROW))


def nested_name(k: int) -> str:
    """The task's name of the k-th (1-based, narrowest first) window between r_min and the own one."""
    return f"nested_{k}"


def with_windows(instruction: TrainInstruction, windows: list[tuple[WidthPlan, Weights]]) -> TrainInstruction:
    """``instruction`` (without a teacher) that also trains each of ``windows`` (plan, its
    weights; narrowest first), by the instruction's recipe before ``"model"``, and returns them, named
    ``nested_name(1)``, ``nested_name(2)``, ..."""
    named = {nested_name(k): window for k, window in enumerate(windows, start=1)}
    return dataclasses.replace(
        instruction,
        context={**instruction.context, **{name: plan.context() for name, (plan, _) in named.items()}},
        models={**instruction.models,
                **{name: ModelRecord(plan.spec, weights) for name, (plan, weights) in named.items()}},
        steps_before=(*instruction.steps_before, *(TrainStep(name, instruction.recipe) for name in named)),
        returns=(*instruction.returns, *named))


def window_returns(update: ClientUpdate, index_map) -> list[tuple[dict, tuple[Weights, IndexMap, float]]]:
    """(plan context, (weights, index map, samples)) of every returned ``nested_k`` window of
    ``update``, narrowest first (``index_map``: context -> the plan's index map)."""
    out = []
    k = 1
    while (name := nested_name(k)) in update.instruction.context:
        if name in update.others:
            context = update.instruction.context[name]
            out.append((context, (update.others[name], index_map(context), update.num_samples)))
        k += 1
    return out


def narrow_returns(updates: list[ClientUpdate], index_map) -> list[tuple[Weights, IndexMap, float]]:
    """(weights, index map, samples) of every returned narrow model (``index_map``: context ->
    the plan's index map)."""
    return [(u.others[NARROW], index_map(u.instruction.context[NARROW]), u.num_samples)
            for u in updates if NARROW in u.others and NARROW in u.instruction.context]
