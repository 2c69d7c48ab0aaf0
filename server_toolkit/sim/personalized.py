"""Personalised federated rounds in one process, for benchmarks of pFedHN & co.

The in-process runner (``sim/inprocess.py``: the same ``Method`` objects, devices trained
as the agent trains them, device-local tensors and teachers included), plus what
personalised methods are measured by:

* every device holds a local test split; after each round each device's personal model
  (``method.personal_model``: what the method would send it now, e.g. freshly generated
  by the hypernetwork, no fine-tuning) is evaluated on it with the device's own BatchNorm
  statistics. For methods without personal models (one global model cut per tier, e.g.
  HeteroFL) the model the device would be sent next round is evaluated;
* ``server_s``: the seconds the method's ``configure_train`` + ``aggregate_train`` took,
  the server's work per round.

Each row also reports ``personal_accuracy`` (mean over devices, each device counting
once) and ``personal_accuracy_<architecture>``.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sdk_device.local_training import LocalTensors
from sdk_device.runtimes.recipe import Recipe

from ..methods.base import ClientUpdate, Method, TrainInstruction, Weights
from ..models.architectures import Architecture
from . import inprocess
from .inprocess import LocalDevice, _Runtimes


@dataclass
class PersonalDevice(LocalDevice):
    """A simulated device with a local test split and its device-local tensors."""

    x_test: np.ndarray
    y_test: np.ndarray

    def __post_init__(self) -> None:
        self.local = LocalTensors()  # the tensors tasks leave out (BatchNorm statistics), per program


def train_on_device(device: PersonalDevice, instruction: TrainInstruction, runtimes: _Runtimes,
                    seed: int) -> ClientUpdate:
    """What the device's agent would return for ``instruction`` (trained with ``seed``)."""
    return inprocess.train_on_device(device, instruction, runtimes, device.local, seed)


def local_training_target(device: PersonalDevice, arch: Architecture, recipe: Recipe, runtimes: _Runtimes,
                          seed: int) -> Callable[[Weights], np.ndarray]:
    """``target(generated)`` for ``HypernetMethod.adapt_client``: train the generated
    parameters on ``device`` (one task, ``recipe``) and return the trained flat (K,) vector:
    the paper's procedure for a new client."""
    steps = itertools.count(1)

    def target(generated: Weights) -> np.ndarray:
        instruction = TrainInstruction(device.info.device_id, arch.spec, generated, recipe)
        update = train_on_device(device, instruction, runtimes, seed * 100_003 + next(steps))
        return arch.flatten(update.weights)

    return target


def local_test_accuracy(device: PersonalDevice, spec: dict, params: Weights, runtimes: _Runtimes,
                        recalibrate: bool = False) -> float:
    """Accuracy on ``device``'s test split of ``spec`` with ``params`` completed by the
    device's own tensors (BatchNorm statistics). ``recalibrate``: first re-estimate the
    BatchNorm statistics for ``params`` on the device's training data (forward passes, no
    labels, no training), as a device could before deploying received parameters."""
    from ..torch_utils import input_batches, recalibrate_batchnorm
    runtime, program_id = runtimes.get(spec, role="evaluate")
    runtime.set_weights(device.local.complete(program_id, params, runtime.get_weights()))
    if recalibrate:
        recalibrate_batchnorm(runtime.model, input_batches(device.x))
    return runtime.evaluate(device.x_test, device.y_test).accuracy


def personal_accuracies(method: Method, weights: Weights, devices: list[PersonalDevice], runtimes: _Runtimes,
                        next_round: int, recalibrate: bool = False) -> dict[str, tuple[str, float]]:
    """{device id: (architecture, accuracy of its personal model on its local test split)}
    (``recalibrate``: see ``local_test_accuracy``)."""
    models: dict[str, tuple[dict, Weights, str]] = {}
    personal = getattr(method, "personal_model", None)
    if personal is not None:
        for d in devices:
            found = personal(d.info.device_id)
            if found is not None:
                models[d.info.device_id] = (found[0].spec, found[1], found[0].name)
    else:
        tiers = {d.info.device_id: d.info.tier or "model" for d in devices}
        for i in method.configure_train(next_round, weights, [d.info for d in devices]):
            models[i.device_id] = (i.spec, i.weights, tiers[i.device_id])
    return {d.info.device_id: (models[d.info.device_id][2],
                               local_test_accuracy(d, *models[d.info.device_id][:2], runtimes, recalibrate))
            for d in devices if d.info.device_id in models}


def run_personalized(method: Method, devices: list[PersonalDevice], rounds: int, seed: int = 0,
                     clients_per_round: int | None = None, on_round: Callable[[dict], None] | None = None,
                     recalibrate_bn: bool = False) -> list[dict]:
    """Run ``rounds`` rounds of ``method``; one metrics row per round (module docstring).
    ``recalibrate_bn`` also reports ``personal_accuracy_recalibrated`` (and per architecture):
    the personal models with BatchNorm statistics re-estimated on each device's data."""
    rng = random.Random(seed)
    runtimes = _Runtimes()
    by_id = {d.info.device_id: d for d in devices}
    weights = method.initial_weights(seed)
    rows = []
    for rnd in range(1, rounds + 1):
        chosen = devices if clients_per_round is None else rng.sample(devices, clients_per_round)
        started = time.perf_counter()
        instructions = method.configure_train(rnd, weights, [d.info for d in chosen])
        server_s = time.perf_counter() - started
        updates = [train_on_device(by_id[i.device_id], i, runtimes, seed * 100_003 + rnd)
                   for i in instructions]
        started = time.perf_counter()
        weights = method.aggregate_train(rnd, weights, updates)
        server_s += time.perf_counter() - started
        row = {"round": rnd, "accepted": len(updates), "server_s": server_s,
               **method.aggregate_evaluate(rnd, updates)}
        for suffix in ("", "_recalibrated") if recalibrate_bn else ("",):
            accuracies = personal_accuracies(method, weights, devices, runtimes, rnd + 1, bool(suffix))
            if accuracies:
                row[f"personal_accuracy{suffix}"] = float(np.mean([a for _, a in accuracies.values()]))
                for arch in sorted({a for a, _ in accuracies.values()}):
                    values = [a for n, a in accuracies.values() if n == arch]
                    row[f"personal_accuracy{suffix}_{arch}"] = float(np.mean(values))
        rows.append(row)
        if on_round:
            on_round(row)
    return rows
