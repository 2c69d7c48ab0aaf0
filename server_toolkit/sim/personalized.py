"""Personalised federated rounds in one process, for benchmarks of pFedHN & co.

The round loop over the in-process grid (``sim/inprocess.run_rounds``: the same loop and
``Method`` objects as ``simulate``, devices trained as the agent trains them, device-local
tensors and teachers included), plus what personalised methods are measured by, as an
evaluator of that loop:

* every device holds a local test split; after each round each device's personal model
  (``method.personal_model``: what the method would send it now, e.g. freshly generated
  by the hypernetwork, no fine-tuning) is evaluated on it with the device's own BatchNorm
  statistics. For methods without personal models (one global model cut per tier, e.g.
  HeteroFL) the model the device would be sent next round is evaluated;
* ``server_s``: the seconds the method's ``configure_train`` + ``aggregate_train`` took,
  the server's work per round (the loop's ``time_configure_s`` + ``time_aggregate_s``).

Each row also reports ``personal_accuracy`` (mean over devices, each device counting
once) and ``personal_accuracy_<architecture>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..methods.abilities import has_personal_models
from ..methods.base import Method, Weights
from ..rounds.local_device import LocalDevice, TorchRuntimePool, local_test_accuracy
from .inprocess import run_rounds


@dataclass
class PersonalDevice(LocalDevice):
    """A simulated device with a local test split (x_test (N, C, H, W), y_test (N,))."""

    x_test: np.ndarray
    y_test: np.ndarray


def personal_accuracies(method: Method, weights: Weights, devices: list[PersonalDevice],
                        runtimes: TorchRuntimePool, next_round: int,
                        recalibrate: bool = False) -> dict[str, tuple[str, float]]:
    """{device id: (architecture, accuracy of its personal model on its local test split)}
    (``recalibrate``: see ``local_test_accuracy``)."""
    models: dict[str, tuple[dict, Weights, str]] = {}
    if has_personal_models(method):
        for d in devices:
            found = method.personal_model(d.info.device_id)
            if found is not None:
                models[d.info.device_id] = (found[0].spec, found[1], found[0].name)
    else:
        tiers = {d.info.device_id: d.info.tier or "model" for d in devices}
        for i in method.configure_train(next_round, weights, [d.info for d in devices]):
            models[i.device_id] = (i.spec, i.weights, tiers[i.device_id])
    out = {}
    for d in devices:
        if d.info.device_id in models:
            spec, params, arch = models[d.info.device_id]
            out[d.info.device_id] = (arch, local_test_accuracy(d, d.x_test, d.y_test, spec, params, runtimes,
                                                               recalibrate))
    return out


class PersonalEvaluation:
    """A round-loop evaluator: every device's personal model on its local test split
    (``personal_accuracy``, ``personal_accuracy_<architecture>``; with ``recalibrate_bn``
    also the ``_recalibrated`` variants)."""

    def __init__(self, method: Method, devices: list[PersonalDevice], recalibrate_bn: bool = False) -> None:
        self.method, self.devices, self.recalibrate_bn = method, devices, recalibrate_bn
        self.runtimes = TorchRuntimePool()

    def __call__(self, round_number: int, weights: Weights) -> dict:
        row: dict = {}
        for suffix in ("", "_recalibrated") if self.recalibrate_bn else ("",):
            accuracies = personal_accuracies(self.method, weights, self.devices, self.runtimes,
                                             round_number + 1, bool(suffix))
            if accuracies:
                row[f"personal_accuracy{suffix}"] = float(np.mean([a for _, a in accuracies.values()]))
                for arch in sorted({a for a, _ in accuracies.values()}):
                    values = [a for n, a in accuracies.values() if n == arch]
                    row[f"personal_accuracy{suffix}_{arch}"] = float(np.mean(values))
        return row


def run_personalized(method: Method, devices: list[PersonalDevice], rounds: int, seed: int = 0,
                     clients_per_round: int | None = None, on_round: Callable[[dict], None] | None = None,
                     recalibrate_bn: bool = False) -> list[dict]:
    """Run ``rounds`` rounds of ``method``; one metrics row per round (module docstring)."""
    def with_server_s(row: dict) -> None:
        row["server_s"] = row["time_configure_s"] + row["time_aggregate_s"]
        if on_round:
            on_round(row)

    evaluation = PersonalEvaluation(method, devices, recalibrate_bn)
    return run_rounds(method, list(devices), rounds, seed=seed, clients_per_round=clients_per_round,
                      on_round=with_server_s, evaluators=(evaluation,)).rows
