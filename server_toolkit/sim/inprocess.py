"""Federated rounds in one process, without a broker: for benchmarks and quick studies.

The same ``Method`` objects as the real orchestrator, the same torch runtime as a device,
but devices are loop iterations instead of processes and blobs never leave memory. Use the
MQTT simulation (``simulate.py``) to test the system; use this to compare methods on
accuracy over many rounds and devices.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sdk_device.local_training import TEACHER_PREFIX, LocalTensors, train_with_teacher
from sdk_device.protocol import modelspec
from sdk_device.protocol.blobs import sha256_hex
from sdk_device.runtimes.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction


@dataclass
class LocalDevice:
    """A simulated device: its info (id, tier, samples) and its local data."""

    info: DeviceInfo
    x: np.ndarray
    y: np.ndarray


@dataclass
class RunResult:
    rows: list[dict]  # one metrics row per round, as the orchestrator writes them
    weights: dict[str, np.ndarray]  # the final global weights
    last_updates: list[ClientUpdate] = field(default_factory=list)  # what the devices returned last round


def run_rounds(method: Method, devices: list[LocalDevice], rounds: int,
               test_data: tuple[np.ndarray, np.ndarray] | None = None, seed: int = 0,
               clients_per_round: int | None = None,
               on_round: Callable[[dict], None] | None = None,
               server_data: tuple[np.ndarray, np.ndarray] | None = None) -> RunResult:
    """Run ``rounds`` rounds of ``method`` over ``devices`` (sampling ``clients_per_round``).
    ``server_data``: the (x, y) a method with ``server_fraction`` > 0 keeps (cut it off the
    devices' data with ``data.server_slice.take_server_slice``). Tasks are trained as a device
    agent trains them (``sdk_device.local_training``): tensors a task leaves out stay on the
    device, teachers are trained/used as the task says."""
    if server_data is not None:
        method.attach_server_data(*server_data)
    elif method.server_fraction > 0 and method.server_data is None:
        raise ValueError(f"method {method.name!r} needs server data: pass server_data")
    rng = random.Random(seed)
    weights = method.initial_weights(seed)
    runtimes = _Runtimes()
    local = {d.info.device_id: LocalTensors() for d in devices}  # each device's own tensors
    by_id = {d.info.device_id: d for d in devices}
    rows = []
    for rnd in range(1, rounds + 1):
        chosen = devices if clients_per_round is None else rng.sample(devices, clients_per_round)
        updates = []
        for instruction in method.configure_train(rnd, weights, [d.info for d in chosen]):
            updates.append(train_on_device(by_id[instruction.device_id], instruction, runtimes,
                                           local[instruction.device_id], seed * 100003 + rnd))
        weights = method.aggregate_train(rnd, weights, updates)
        row = {"round": rnd, "accepted": len(updates), **method.aggregate_evaluate(rnd, updates)}
        if test_data is not None:
            row.update(method.evaluate(weights, *test_data))
        rows.append(row)
        if on_round:
            on_round(row)
    return RunResult(rows, weights, updates if rounds else [])


class _Runtimes:
    """One torch runtime per distinct program (spec), reused across devices and rounds."""

    def __init__(self) -> None:
        self._by_program: dict[str, TorchRuntime] = {}

    def get(self, spec: dict, role: str = "student") -> tuple[TorchRuntime, str]:
        program = modelspec.dumps(spec)
        program_id = sha256_hex(program)
        key = f"{role}:{program_id}"
        if key not in self._by_program:
            self._by_program[key] = TorchRuntime()
            self._by_program[key].load_program(program, modelspec.FORMAT)
        return self._by_program[key], program_id


def train_on_device(device: LocalDevice, instruction: TrainInstruction, runtimes: _Runtimes,
                    local: LocalTensors, seed: int) -> ClientUpdate:
    """What ``device``'s agent would return for ``instruction``, trained with ``seed`` and the
    device's own tensors ``local``."""
    recipe = Recipe.from_dict({**instruction.recipe.to_dict(), "seed": seed})
    trained, stats, teacher = train_instruction(instruction, device, recipe, runtimes, local)
    metrics = {"samples": stats.samples, "loss": stats.loss, "accuracy": stats.accuracy,
               "label_counts": np.bincount(device.y).tolist()}
    if teacher.stats is not None:
        metrics.update(teacher_loss=teacher.stats.loss, teacher_accuracy=teacher.stats.accuracy)
    return ClientUpdate(instruction.device_id, len(device.y), trained, metrics, instruction)


def train_instruction(instruction: TrainInstruction, device: LocalDevice, recipe: Recipe,
                      runtimes: _Runtimes, local: LocalTensors):
    """Train one instruction on ``device`` like the agent does; returns (uploaded weights,
    student stats, TeacherRun)."""
    runtime, program_id = runtimes.get(instruction.spec)
    runtime.set_weights(local.complete(program_id, instruction.weights, runtime.get_weights()))
    teacher_runtime = teacher_id = None
    if instruction.teacher is not None:
        teacher_runtime, teacher_id = runtimes.get(instruction.teacher.spec, role="teacher")
        teacher_runtime.set_weights(local.complete(teacher_id, instruction.teacher.weights,
                                                   teacher_runtime.get_weights()))
    stats, teacher = train_with_teacher(runtime, device.x, device.y, recipe, teacher=teacher_runtime,
                                        train_teacher=bool(instruction.teacher and instruction.teacher.train))
    trained = local.remember(program_id, instruction.weights, runtime.get_weights())
    if teacher.weights is not None:
        kept = local.remember(teacher_id, instruction.teacher.weights, teacher.weights)
        trained.update({TEACHER_PREFIX + k: v for k, v in kept.items()})
    return trained, stats, teacher
