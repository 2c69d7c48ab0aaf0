"""Tasks as the server persists them: what was sent, so a restarted server can aggregate
the updates it accepted before dying without asking the method to plan the round again.

A task record is JSON: per model, its spec and the blob ids of its weights (and of
forwarded programs) in the server's blob store, which keeps every blob it offered; the
recipe, the steps, the models returned, the outputs asked for and the method's ``context``.
"""

from __future__ import annotations

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.protocol.task_plan import TrainStep
from sdk_device.transport.blob_store import BlobStore

from ..fleet.registry import FleetRegistry
from ..methods.base import MODEL, ClientUpdate, ModelRecord, TrainInstruction

ARRAYS_KEY = "arrays"  # in a stored update's metrics: {record name: blob id} of its other array records


def task_record(instruction: TrainInstruction, weights_blobs: dict[str, str],
                program_blobs: dict[str, list[tuple[str, str]]]) -> dict:
    """The JSON record of ``instruction`` sent with these blob ids (per model name)."""
    return {
        "device_id": instruction.device_id,
        "recipe": instruction.recipe.to_dict(),
        "context": instruction.context,
        "models": {name: {"spec": model.spec, "weights": weights_blobs[name],
                          "programs": [list(p) for p in program_blobs[name]] if model.programs else []}
                   for name, model in instruction.all_models().items()},
        "steps_before": [{"model": s.model, "recipe": s.recipe.to_dict(), "teacher": s.teacher}
                         for s in instruction.steps_before],
        "teacher": instruction.teacher,
        "returns": list(instruction.returns),
        "reports": instruction.reports,
        "holdout": instruction.holdout,
        "deploys": instruction.deploys,
        "holdout_ensemble": instruction.holdout_ensemble,
        "holdout_members": list(instruction.holdout_members),
    }


def instruction_from_record(record: dict, store: BlobStore) -> TrainInstruction:
    """The instruction a task record describes, its tensors read back from ``store``."""
    models = {name: ModelRecord(entry["spec"], decode_tensors(store.get(entry["weights"])),
                                tuple((fmt, store.get(blob)) for fmt, blob in entry.get("programs", [])))
              for name, entry in record["models"].items()}
    main = models.pop(MODEL)
    return TrainInstruction(
        device_id=record["device_id"], spec=main.spec, weights=main.weights,
        recipe=Recipe.from_dict(record["recipe"]), context=record.get("context") or {}, models=models,
        steps_before=tuple(TrainStep(s["model"], Recipe.from_dict(s["recipe"]), s.get("teacher"))
                           for s in record.get("steps_before", [])),
        teacher=record.get("teacher"), returns=tuple(record.get("returns", [MODEL])),
        reports=record.get("reports") or {}, programs=main.programs, holdout=record.get("holdout") or 0.0,
        deploys=record.get("deploys") or MODEL, holdout_ensemble=bool(record.get("holdout_ensemble")),
        holdout_members=tuple(record.get("holdout_members") or ()),
    )


def stored_update(row: dict, instruction: TrainInstruction | None, registry: FleetRegistry,
                  store: BlobStore, decoded: dict[str, dict] | None = None) -> ClientUpdate:
    """An accepted update (a registry row) with the instruction it answered: ``instruction``,
    or (accepted before a restart) the one persisted in its task record. ``decoded``: its
    array records as already decoded (record name -> tensors; None: read from ``store``)."""
    arrays = row["metrics"].get(ARRAYS_KEY, {})
    if decoded is not None and MODEL in decoded and set(arrays) <= set(decoded):
        weights, others = decoded[MODEL], {name: decoded[name] for name in arrays}
    else:
        weights = decode_tensors(store.get(row["blob_id"]))
        others = {name: decode_tensors(store.get(blob)) for name, blob in arrays.items()}
    if instruction is None:
        record = registry.task(row["task_id"])
        if record is None:
            raise RuntimeError(f"task {row['task_id']} of an accepted update has no record")
        instruction = instruction_from_record(record, store)
    metrics = {k: v for k, v in row["metrics"].items() if k != ARRAYS_KEY}
    return ClientUpdate(row["device_id"], row["num_samples"], weights, metrics, instruction, others)
