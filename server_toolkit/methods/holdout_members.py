"""Which models of a task a device scores together on its held-back split (``task.holdout_members``).

A tier that deploys several models together (``Method.deployable_members``: a width method's
``deploy="nested"``, its own window and every narrower fleet window at offset 0) is scored on
the server by the mean softmax of all of them (``methods/tier_accuracy.py``). For the device's
held-back score to be the same prediction, its task must carry each of those members and name
them in ``holdout_members`` (``sdk_device.holdout``). ``member_models`` finds each member among
the task's models (HeteroFL's ``also_narrowest`` / ``also_nested`` already send ``"narrow"`` and
``"nested_k"``, exactly those blocks of the global weights, as received), and adds the others as
extra models ``"member_1"``, ``"member_2"``, ... that are neither trained nor returned (the
device loads every model of a task, as it loads a frozen teacher).

Decisions: a member is the task's model of the same spec and bit-identical weights (the spec
alone could match a rolling window elsewhere); extra models are offered as ``torchspec/1`` only
(the MQTT grid exports other formats for ``"model"`` alone), so for a device without the torch
runtime the server lists no members at all: it scores its own window, never a part of the
ensemble. The loop asks only when it sets ``holdout`` > 0 (extra bytes otherwise). Edges: a
relaying edge passes the task's ``holdout_members`` (and its models) to its group; a bundle's
members and a summing edge's group get one model each and score their own window.
"""

from __future__ import annotations

import numpy as np

from sdk_device.holdout import MAX_MEMBERS

from .base import ModelRecord, TrainInstruction, Weights

EXTRA = "member_"  # the task's name of an extra member: member_1, member_2, ...


def _same(record: ModelRecord, spec: dict, weights: Weights) -> bool:
    return record.spec == spec and record.weights.keys() == weights.keys() and all(
        np.array_equal(record.weights[k], weights[k]) for k in weights)


def member_models(instruction: TrainInstruction, members: list[tuple[dict, Weights]],
                  runtimes: tuple[str, ...]) -> tuple[dict[str, ModelRecord], tuple[str, ...]]:
    """(extra models to add to ``instruction``, the names of all ``members`` in it) for a device
    with ``runtimes``; ``members``: (spec, weights) of each model scored beside the task's
    deployed one. ({}, ()) when there are none, more than ``MAX_MEMBERS``, or the device lacks
    torch and a member is not already a model of its task."""
    if not members or len(members) > MAX_MEMBERS:
        return {}, ()
    have = {name: record for name, record in instruction.models.items() if name != instruction.deploys}
    extra: dict[str, ModelRecord] = {}
    names: list[str] = []
    for spec, weights in members:
        found = next((name for name, record in have.items()
                      if name not in names and _same(record, spec, weights)), None)
        if found is None:
            if "torch" not in runtimes:
                return {}, ()
            found = f"{EXTRA}{len(extra) + 1}"
            extra[found] = ModelRecord(spec, weights)
        names.append(found)
    return extra, tuple(names)
