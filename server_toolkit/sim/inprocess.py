"""Federated rounds in one process, without a broker: ``run_rounds`` for benchmarks and tests.

It is the round loop (``rounds/loop.py``) over the in-process grid (``rounds/inprocess_grid.py``):
the same loop, seeds and metrics rows as ``fedsdk-server simulate``, with devices that are
loop iterations. Use the MQTT simulation to test the system; use this to compare methods
on accuracy over many rounds and devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..methods.abilities import wants_server_data
from ..methods.base import ClientUpdate, Method
from ..rounds.inprocess_grid import InProcessGrid
from ..rounds.local_device import LocalDevice
from ..rounds.loop import Evaluator, LoopConfig, RoundCallback, RoundLoop


@dataclass
class RunResult:
    rows: list[dict]  # one metrics row per round, as the loop writes them
    weights: dict[str, np.ndarray]  # the final global weights
    last_updates: list[ClientUpdate] = field(default_factory=list)  # what the devices returned last round


def run_rounds(method: Method, devices: list[LocalDevice], rounds: int,
               test_data: tuple[np.ndarray, np.ndarray] | None = None, seed: int = 0,
               clients_per_round: int | None = None, on_round: RoundCallback | None = None,
               server_data: tuple[np.ndarray, np.ndarray] | None = None,
               evaluators: tuple[Evaluator, ...] = ()) -> RunResult:
    """Run ``rounds`` rounds of ``method`` over ``devices`` (sampling ``clients_per_round``).
    ``server_data``: the (x, y) a method with ``server_fraction`` > 0 keeps (cut it off the
    devices' data with ``take_server_slice``)."""
    if server_data is not None:
        method.attach_server_data(*server_data)
    elif wants_server_data(method) and method.server_data is None:
        raise ValueError(f"method {method.name!r} needs server data: pass server_data")
    # a measurement: the quality guard warns of a divergence but changes nothing (no rollback)
    config = LoopConfig(rounds=rounds, clients_per_round=clients_per_round, seed=seed,
                        on_divergence="continue")
    loop = RoundLoop(method, InProcessGrid(devices), config, test_data=test_data, on_round=on_round,
                     evaluators=evaluators)
    loop.start()
    rows = loop.run()
    return RunResult(rows, loop.global_weights, loop.last_updates)
