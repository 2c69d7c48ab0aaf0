"""A device simulated in this process: its data, its own tensors, and a task trained on it
exactly as the device agent trains it (``sdk_device.local_training``: tensors a task leaves
out stay on the device, teachers are trained or used as the task says, the result reports
the label histogram and, when asked, smashed data), with the torch runtime.

Used by the in-process grid (``rounds/inprocess_grid.py``) and by ``fedsdk-server hn adapt``,
which trains a new device's data on the server the way the device would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedcore import modelspec
from fedcore.recipe import Recipe, StepStats
from sdk_device.local_training import TEACHER_PREFIX, LocalTensors, TeacherRun, train_with_teacher
from sdk_device.protocol.blobs import sha256_hex
from sdk_device.protocol.smashed import X, Y
from sdk_device.runtimes.torch_runtime import TorchRuntime

from ..methods.base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from .loop import task_seed


@dataclass
class LocalDevice:
    """A simulated device: its info (id, tier, samples), its local training data and the
    tensors it keeps to itself between tasks (e.g. BatchNorm statistics)."""

    info: DeviceInfo
    x: np.ndarray
    y: np.ndarray
    local: LocalTensors = field(default_factory=LocalTensors, repr=False, kw_only=True)


class TorchRuntimePool:
    """One torch runtime per distinct program (spec) and role, reused across devices and rounds."""

    def __init__(self) -> None:
        self._by_program: dict[str, TorchRuntime] = {}

    def get(self, spec: dict, role: str = "student") -> tuple[TorchRuntime, str]:
        """(runtime holding ``spec``'s program, the program's blob id)."""
        program = modelspec.dumps(spec)
        program_id = sha256_hex(program)
        key = f"{role}:{program_id}"
        if key not in self._by_program:
            self._by_program[key] = TorchRuntime()
            self._by_program[key].load_program(program, modelspec.FORMAT)
        return self._by_program[key], program_id


def train_on_device(device: LocalDevice, instruction: TrainInstruction,
                    runtimes: TorchRuntimePool) -> ClientUpdate:
    """What ``device``'s agent would return for ``instruction`` (trained with its recipe's seed)."""
    trained, stats, teacher = train_instruction(instruction, device, runtimes)
    metrics = {"samples": stats.samples, "loss": stats.loss, "accuracy": stats.accuracy,
               "label_counts": np.bincount(device.y).tolist()}
    if teacher.stats is not None:
        metrics.update(teacher_loss=teacher.stats.loss, teacher_accuracy=teacher.stats.accuracy)
    smashed = _smashed(device, instruction, runtimes)
    return ClientUpdate(instruction.device_id, len(device.y), trained, metrics, instruction, smashed)


def train_instruction(instruction: TrainInstruction, device: LocalDevice,
                      runtimes: TorchRuntimePool) -> tuple[Weights, StepStats, TeacherRun]:
    """Train one instruction on ``device`` like the agent does; returns (uploaded weights,
    student stats, what the teacher contributed)."""
    runtime, program_id = runtimes.get(instruction.spec)
    runtime.set_weights(device.local.complete(program_id, instruction.weights, runtime.get_weights()))
    teacher_runtime = teacher_id = None
    if instruction.teacher is not None:
        teacher_runtime, teacher_id = runtimes.get(instruction.teacher.spec, role="teacher")
        teacher_runtime.set_weights(device.local.complete(teacher_id, instruction.teacher.weights,
                                                          teacher_runtime.get_weights()))
    train_teacher = bool(instruction.teacher and instruction.teacher.train)
    stats, teacher = train_with_teacher(runtime, device.x, device.y, instruction.recipe,
                                        teacher=teacher_runtime, train_teacher=train_teacher)
    trained = device.local.remember(program_id, instruction.weights, runtime.get_weights())
    if teacher.weights is not None:
        kept = device.local.remember(teacher_id, instruction.teacher.weights, teacher.weights)
        trained.update({TEACHER_PREFIX + k: v for k, v in kept.items()})
    return trained, stats, teacher


def _smashed(device: LocalDevice, instruction: TrainInstruction,
             runtimes: TorchRuntimePool) -> Weights | None:
    """The smashed data the agent would send (a seeded subset of at most the asked count)."""
    if instruction.smashed is None or not len(device.y):
        return None
    runtime, _ = runtimes.get(instruction.spec)
    pick = np.sort(np.random.default_rng(instruction.recipe.seed).permutation(len(device.y))
                   [: instruction.smashed.samples])
    _, features = runtime.predict(device.x[pick])
    return {X: np.asarray(features, np.float32).reshape(len(pick), -1), Y: device.y[pick].astype(np.int64)}


def local_training_target(device: LocalDevice, spec: dict, recipe: Recipe, runtimes: TorchRuntimePool,
                          seed: int, flatten: Callable[[Weights], np.ndarray],
                          ) -> Callable[[Weights], np.ndarray]:
    """``target(generated)``: train the generated parameters of ``spec`` on ``device`` (one
    task by ``recipe``, a fresh seed per call) and return them trained, ``flatten``ed to (K,)."""
    steps = itertools.count(1)

    def target(generated: Weights) -> np.ndarray:
        step_recipe = Recipe.from_dict({**recipe.to_dict(), "seed": task_seed(seed, next(steps),
                                                                               device.info.device_id)})
        instruction = TrainInstruction(device.info.device_id, spec, generated, step_recipe)
        return flatten(train_on_device(device, instruction, runtimes).weights)

    return target


def local_test_accuracy(device: LocalDevice, x_test: np.ndarray, y_test: np.ndarray, spec: dict,
                        params: Weights, runtimes: TorchRuntimePool, recalibrate: bool = False) -> float:
    """Accuracy on (x_test, y_test) of ``spec`` with ``params`` completed by ``device``'s own
    tensors (BatchNorm statistics). ``recalibrate``: first re-estimate the BatchNorm statistics
    for ``params`` on the device's training data (forward passes, no labels, no training), as
    a device could before deploying received parameters."""
    from ..torch_utils import input_batches, recalibrate_batchnorm

    runtime, program_id = runtimes.get(spec, role="evaluate")
    runtime.set_weights(device.local.complete(program_id, params, runtime.get_weights()))
    if recalibrate:
        recalibrate_batchnorm(runtime.model, input_batches(device.x))
    return runtime.evaluate(x_test, y_test).accuracy
