"""A device simulated in this process: its data, its own tensors, and a task trained on it
exactly as the device agent trains it (``sdk_device.task_runner``: tensors a task leaves
out stay on the device, every step of the task's plan in order, the models it returns and
the outputs it asks for), with the torch runtime.

Used by the in-process grid (``rounds/inprocess_grid.py``) and by ``fedsdk-server hn adapt``,
which trains a new device's data on the server the way the device would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.local_tensors import LocalTensors
from sdk_device.protocol.blobs import sha256_hex
from sdk_device.runtimes.torch_runtime import TorchRuntime
from sdk_device.task_runner import LoadedModel, run_task

from ..methods.base import MODEL, ClientUpdate, DeviceInfo, TrainInstruction, Weights
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
    """What ``device``'s agent would return for ``instruction``: the task's models loaded in
    torch runtimes (completed by the device's own tensors), then ``sdk_device.task_runner``
    (the agent's own task code) runs its plan."""
    loaded = {}
    for name, model in instruction.all_models().items():
        runtime, program_id = runtimes.get(model.spec, role=name)
        runtime.set_weights(device.local.complete(program_id, model.weights, runtime.get_weights()))
        loaded[name] = LoadedModel(runtime, program_id, model.weights)
    output = run_task(instruction.plan(), loaded, device.x, device.y, device.local,
                      holdout=instruction.holdout, holdout_model=instruction.deploys,
                      holdout_ensemble=instruction.holdout_ensemble,
                      holdout_members=instruction.holdout_members)
    arrays = dict(output.arrays)
    return ClientUpdate(instruction.device_id, output.metrics["samples"], arrays.pop(MODEL), output.metrics,
                        instruction, arrays)


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
