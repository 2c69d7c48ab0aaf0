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
    last_updates: list[ClientUpdate] = field(default_factory=list)  # what the devices returned last round


def run_rounds(method: Method, devices: list[LocalDevice], rounds: int,
               test_data: tuple[np.ndarray, np.ndarray] | None = None, seed: int = 0,
               clients_per_round: int | None = None,
               on_round: Callable[[dict], None] | None = None,
               server_data: tuple[np.ndarray, np.ndarray] | None = None) -> RunResult:
    """Run ``rounds`` rounds of ``method`` over ``devices`` (sampling ``clients_per_round``).
    ``server_data``: the (x, y) a method with ``server_fraction`` > 0 keeps (cut it off the
    devices' data with ``sim.server_data.take_server_slice``)."""
    if server_data is not None:
        method.attach_server_data(*server_data)
    elif method.server_fraction > 0 and method.server_data is None:
        raise ValueError(f"method {method.name!r} needs server data: pass server_data")
    rng = random.Random(seed)
    weights = method.initial_weights(seed)
    runtimes: dict[bytes, TorchRuntime] = {}
    by_id = {d.info.device_id: d for d in devices}
    rows = []
    for rnd in range(1, rounds + 1):
        chosen = devices if clients_per_round is None else rng.sample(devices, clients_per_round)
        updates = []
        for instruction in method.configure_train(rnd, weights, [d.info for d in chosen]):
            device = by_id[instruction.device_id]
            program = modelspec.dumps(instruction.spec)
            if program not in runtimes:
                runtimes[program] = TorchRuntime()
                runtimes[program].load_program(program, modelspec.FORMAT)
            runtime = runtimes[program]
            runtime.set_weights(instruction.weights)
            recipe = Recipe.from_dict({**instruction.recipe.to_dict(), "seed": seed * 100003 + rnd})
            stats = runtime.train(device.x, device.y, recipe)
            updates.append(ClientUpdate(instruction.device_id, len(device.y), runtime.get_weights(),
                                        {"samples": stats.samples, "loss": stats.loss,
                                         "accuracy": stats.accuracy}, instruction))
        weights = method.aggregate_train(rnd, weights, updates)
        row = {"round": rnd, "accepted": len(updates), **method.aggregate_evaluate(rnd, updates)}
        if test_data is not None:
            row.update(method.evaluate(weights, *test_data))
        rows.append(row)
        if on_round:
            on_round(row)
    return RunResult(rows, weights, updates if rounds else [])
