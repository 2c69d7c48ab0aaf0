"""Tasks as the server persists them: what was sent, so a restarted server can aggregate
the updates it accepted before dying without asking the method to plan the round again.

A task record is JSON: the model spec, the recipe, the method's per-instruction
``context``, and blob ids of the weights (and of a teacher's weights, of forwarded
programs) in the server's blob store, which keeps every blob it offered.
"""

from __future__ import annotations

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.protocol.smashed import SmashedRequest
from sdk_device.transport.blob_store import BlobStore

from ..methods.base import TeacherSpec, TrainInstruction


def task_record(instruction: TrainInstruction, weights_blob: str, teacher_blob: str | None,
                program_blobs: list[tuple[str, str]]) -> dict:
    """The JSON record of ``instruction`` sent with the given blob ids."""
    teacher = instruction.teacher
    smashed = instruction.smashed
    return {
        "device_id": instruction.device_id,
        "spec": instruction.spec,
        "recipe": instruction.recipe.to_dict(),
        "context": instruction.context,
        "weights": weights_blob,
        "teacher": None if teacher is None else {"spec": teacher.spec, "weights": teacher_blob,
                                                 "train": teacher.train},
        "programs": [list(p) for p in program_blobs] if instruction.programs else [],
        "smashed": None if smashed is None else [smashed.samples, smashed.features, smashed.classes],
    }


def instruction_from_record(record: dict, store: BlobStore) -> TrainInstruction:
    """The instruction a task record describes, its tensors read back from ``store``."""
    teacher = record.get("teacher")
    smashed = record.get("smashed")
    return TrainInstruction(
        device_id=record["device_id"],
        spec=record["spec"],
        weights=decode_tensors(store.get(record["weights"])),
        recipe=Recipe.from_dict(record["recipe"]),
        context=record.get("context") or {},
        teacher=None if teacher is None else TeacherSpec(
            teacher["spec"], decode_tensors(store.get(teacher["weights"])), bool(teacher["train"])),
        programs=tuple((fmt, store.get(blob)) for fmt, blob in record.get("programs", [])),
        smashed=None if smashed is None else SmashedRequest(*smashed),
    )
