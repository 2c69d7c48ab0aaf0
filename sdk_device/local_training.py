"""One task's local training, runtime-independent: device-local tensors and teacher models.

Shared by the device agent and the in-process runner of benchmarks, so both train a task
the same way:

* **Device-local tensors.** A task's weights may omit some of the program's tensors (e.g.
  BatchNorm running statistics that MH-pFedHN keeps on the device). ``LocalTensors`` keeps
  the device's own last values per program and fills the gaps; the device returns exactly
  the tensors it received.
* **Teachers.** A task may bring a teacher model (``Task.teacher``). ``train_with_teacher``
  trains the teacher first when asked (plain CE, same recipe), computes its logits and
  last-hidden features on the local data in eval mode, and trains the student with them as
  the distillation loss's per-sample inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fedcore.recipe import Recipe

from .protocol.blobs import decode_tensors, encode_tensors
from .runtimes.base import Progress, StepStats

Weights = dict[str, np.ndarray]
TEACHER_PREFIX = "teacher."


class LocalTensors:
    """The device's own last full weights per program (by program blob id), kept under
    ``root`` as safetensors so they survive agent restarts (``root`` None: memory only)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self._cache: dict[str, Weights] = {}

    def _path(self, program_id: str) -> Path | None:
        return None if self.root is None else self.root / f"{program_id}.safetensors"

    def get(self, program_id: str) -> Weights | None:
        if program_id not in self._cache:
            path = self._path(program_id)
            if path is None or not path.is_file():
                return None
            self._cache[program_id] = decode_tensors(path.read_bytes())
        return self._cache[program_id]

    def put(self, program_id: str, weights: Weights) -> None:
        self._cache[program_id] = weights
        path = self._path(program_id)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(encode_tensors(weights))
            tmp.replace(path)

    def complete(self, program_id: str, sent: Weights, current: Weights) -> Weights:
        """``sent`` plus, for the program's tensors it omits, this device's last values (or
        ``current``, the runtime's weights right after loading, the first time)."""
        missing = set(current) - set(sent)
        if not missing:
            return sent
        unknown = sorted(set(sent) - set(current))
        if unknown:
            raise KeyError(f"weights do not fit the program: unexpected {unknown[:5]}")
        own = self.get(program_id) or {}
        filled = {k: (own[k] if k in own and own[k].shape == current[k].shape else current[k])
                  for k in missing}
        return {**sent, **filled}

    def remember(self, program_id: str, sent: Weights, trained: Weights) -> Weights:
        """Keep ``trained`` (full) when the task sent a subset; return the tensors to upload:
        exactly the names that were sent."""
        if set(trained) != set(sent):
            self.put(program_id, trained)
        return {k: trained[k] for k in sent}


@dataclass(frozen=True)
class TeacherRun:
    """What the teacher contributed: its trained weights (``train`` only) and stats."""

    weights: Weights | None
    stats: StepStats | None


def teacher_extras(teacher_runtime, x: np.ndarray, recipe: Recipe) -> dict[str, np.ndarray]:
    """The per-sample teacher arrays ``recipe``'s loss reads: ``teacher_logits`` (N, K) and,
    for ``recipfl_kt`` with a feature size, ``teacher_features`` (N, F)."""
    logits, features = teacher_runtime.predict(x)
    extras = {"teacher_logits": logits}
    if recipe.loss == "recipfl_kt" and recipe.teacher_features:
        if features.shape[1] != recipe.teacher_features:
            raise ValueError(f"teacher has {features.shape[1]} features, the recipe says "
                             f"{recipe.teacher_features}")
        extras["teacher_features"] = features
    return extras


def train_with_teacher(student, x: np.ndarray, y: np.ndarray, recipe: Recipe,
                       teacher=None, train_teacher: bool = False,
                       progress: Progress | None = None) -> tuple[StepStats, TeacherRun]:
    """Train ``student`` (a runtime holding the task's program and weights) on (x, y).

    ``teacher``: a runtime with ``predict`` (the torch runtime) holding the teacher, or None.
    With ``train_teacher`` it is trained first (CE, same recipe) and its weights returned.
    Progress: the teacher's training fills the first half of the bar."""
    if teacher is None:
        if recipe.needs_teacher:
            raise ValueError(f"loss {recipe.loss!r} needs a teacher model and the task has none")
        return student.train(x, y, recipe, progress=progress), TeacherRun(None, None)
    teacher_stats = teacher_weights = None
    half = (lambda f: progress(f / 2)) if progress else None
    if train_teacher:
        teacher_stats = teacher.train(x, y, replace(recipe, loss="ce"), progress=half)
        teacher_weights = teacher.get_weights()
    extras = teacher_extras(teacher, x, recipe) if recipe.needs_teacher else None
    rest = (lambda f: progress(0.5 + f / 2)) if progress and train_teacher else progress
    kwargs = {"extras": extras} if extras else {}
    stats = student.train(x, y, recipe, progress=rest, **kwargs)
    return stats, TeacherRun(teacher_weights, teacher_stats)
