"""Federated rounds in one process, without a broker: for benchmarks and quick studies.

The same ``Method`` objects as the real orchestrator, the same torch runtime as a device,
but devices are loop iterations instead of processes and blobs never leave memory. Use the
MQTT simulation (``simulate.py``) to test the system; use this to compare methods on
accuracy over many rounds and devices.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sdk_device.protocol import modelspec
from sdk_device.runtimes.recipe import Recipe
from sdk_device.runtimes.torch_runtime import TorchRuntime

from ..methods.base import ClientUpdate, DeviceInfo, Method


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


def run_rounds(method: Method, devices: list[LocalDevice], rounds: int,
               test_data: tuple[np.ndarray, np.ndarray] | None = None, seed: int = 0,
               clients_per_round: int | None = None,
               on_round: Callable[[dict], None] | None = None) -> RunResult:
    """Run ``rounds`` rounds of ``method`` over ``devices`` (sampling ``clients_per_round``)."""
    rng = random.Random(seed)
    weights = method.initial_weights(seed)
    runtimes: dict[tuple[bytes, str], TorchRuntime] = {}
    by_id = {d.info.device_id: d for d in devices}
    rows = []
    for rnd in range(1, rounds + 1):
        chosen = devices if clients_per_round is None else rng.sample(devices, clients_per_round)
        updates = []
        for instruction in method.configure_train(rnd, weights, [d.info for d in chosen]):
            device = by_id[instruction.device_id]
            recipe = Recipe.from_dict({**instruction.recipe.to_dict(), "seed": seed * 100003 + rnd})
            extras, returned = None, {}
            if instruction.teacher is not None:  # as the agent does: (train,) then predict
                teacher = _runtime(runtimes, instruction.teacher.spec, "teacher")
                teacher.set_weights(instruction.teacher.weights)
                if instruction.teacher.train:
                    teacher.train(device.x, device.y, dataclasses.replace(recipe, loss="ce"))
                    returned = {f"teacher.{k}": v for k, v in teacher.get_weights().items()}
                logits, features = teacher.predict(device.x)
                extras = {"teacher_logits": logits, "teacher_features": features}
            runtime = _runtime(runtimes, instruction.spec, "student")
            runtime.set_weights(instruction.weights)
            stats = runtime.train(device.x, device.y, recipe, extras=extras)
            metrics = {"samples": stats.samples, "loss": stats.loss, "accuracy": stats.accuracy,
                       "label_counts": np.bincount(device.y).tolist()}
            trained = {**runtime.get_weights(), **returned}
            updates.append(ClientUpdate(instruction.device_id, len(device.y), trained, metrics, instruction))
        weights = method.aggregate_train(rnd, weights, updates)
        row = {"round": rnd, "accepted": len(updates), **method.aggregate_evaluate(rnd, updates)}
        if test_data is not None:
            row.update(method.evaluate(weights, *test_data))
        rows.append(row)
        if on_round:
            on_round(row)
    return RunResult(rows, weights)


def _runtime(runtimes: dict, spec: dict, role: str) -> TorchRuntime:
    """A cached runtime for ``spec`` (a teacher and its student may share a spec, not a runtime)."""
    key = (modelspec.dumps(spec), role)
    if key not in runtimes:
        runtimes[key] = TorchRuntime()
        runtimes[key].load_program(key[0], modelspec.FORMAT)
    return runtimes[key]
