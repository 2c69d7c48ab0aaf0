"""Secure aggregation inside an edge's group: edges + ``--secagg``.

A generic edge started with ``--secagg`` (``fedsdk-server edge --method M --secagg``) runs
the SecAgg+ server role for its own group: its downstream grid is ``SecAggMqttGrid``
(``secagg/mqtt_grid.py``) serving the server's method over the global model the server
sent, so each group round ends in the unmasked *sum* of the group's masked vectors and the
edge never holds one device's update in the clear. ``SecureGroupSum`` turns that sum
(``secagg/aggregate.py:UnmaskedSum``) into the group's ``Partial`` (per element S = sum_i a_i
x_i and A = sum_i a_i, decoded from the fixed point), which the edge sends up as any generic
edge does (``model`` = S / A, ``coverage`` = A: ``edge/partial.py``). The server folds the
edges' partials into the method's aggregate (``edge/layer.py``); it sees group sums only.

What each party sees: a device, its own update; an edge, its group's sum (and the devices'
metrics: samples, loss, accuracy); the server, the edges' group sums. A group's sum of one
device is that device's update, so a secure group needs at least ``MIN_GROUP`` devices: the
edge refuses to start with a smaller ``--min-devices``, ``simulate`` refuses groups smaller
than that, and a group round with fewer devices left fails (the edge refuses the task).
The result equals flat FedAvg / HeteroFL of the same updates within the fixed-point
tolerance (``fedcore/secagg/fixed_point.py``: 0.5 / 2**20 per weighted value).
"""

from __future__ import annotations

import numpy as np

from ..methods.base import Method, Weights
from ..rounds.aggregator import Aggregator, MethodAggregate, RoundInput
from ..rounds.mqtt_grid import MqttGrid
from ..secagg.aggregate import UnmaskedSum
from ..secagg.mqtt_grid import SECURE_EDGE, SecAggMqttGrid, SecAggSettings
from .layer import EdgeFold, edge_stack
from .partial import Partial

MIN_GROUP = 3  # devices a secure group round needs (secagg/protocol.py refuses fewer key holders)
__all__ = ["MIN_GROUP", "SECURE_EDGE", "SecureGroupSum", "group_grid", "group_partial", "min_group_error",
           "round_updates"]


def group_partial(unmasked: UnmaskedSum) -> Partial:
    """The group's partial sum from a secure round's unmasked sum. A sum of clipped deltas
    weighted 1 (central DP, ``of_deltas``) becomes the partial of the clipped models, S = the
    deltas' sum + A x the weights sent, so the edge answers as any generic edge (``model`` = the
    mean clipped model); the server takes the deltas' sum back as A (model - sent)."""
    sums, cover = unmasked.sums()
    if unmasked.of_deltas:
        sums = {k: v + cover[k] * np.asarray(unmasked.template[k], np.float64) for k, v in sums.items()}
    return Partial(sums, cover)


class SecureGroupSum(Aggregator):
    """The top of a secure edge's group stack: a secure round's sum becomes the group's partial
    (kept by the edge's ``SumRelay``, ``adopt``) and the group's mean; a round without one (a
    group of edges only: their answers are partials already) goes down unchanged."""

    def aggregate(self, rnd: int, global_weights: Weights, updates, info: RoundInput) -> Weights:
        secure = info.exchange.secure if info.exchange is not None else None
        if not isinstance(secure, UnmaskedSum):
            return self.inner.aggregate(rnd, global_weights, updates, info)
        return self.method.adopt(group_partial(secure), global_weights)


def group_grid(endpoint, registry, method: Method, secagg: dict | None, seed: int,
               program_formats: list[str] | None = None,
               pte_kernels: str = "fused") -> tuple[MqttGrid, Aggregator]:
    """An edge's group grid and group stack: plain (``secagg`` None) or secure (the settings
    of ``secagg/mqtt_grid.py:SecAggSettings`` as a dict; no norm bound: no update is in the
    clear). Either exports its group's programs in ``program_formats`` (None: torchspec/1), pte/1
    ones with ``pte_kernels`` (a device refusing them gets portable ones: ``rounds/kernel_fallback.py``)."""
    programs = {"program_formats": program_formats, "pte_kernels": pte_kernels}
    if secagg is None:
        return MqttGrid(endpoint, registry, **programs), edge_stack(method)
    grid = SecAggMqttGrid(endpoint, registry, method, SecAggSettings(**secagg), seed=seed, **programs)
    return grid, SecureGroupSum(EdgeFold(MethodAggregate(method)))


def round_updates(grid: MqttGrid, registry, rnd: int) -> list[dict]:
    """Group round ``rnd``'s accepted updates as the registry lists them (``num_samples``,
    ``metrics``); a secure round persists none, so its metrics-only updates instead."""
    if isinstance(grid, SecAggMqttGrid) and not registry.updates(rnd):
        return [{"num_samples": u.num_samples, "metrics": u.metrics} for u in grid.last_updates]
    return registry.updates(rnd)


def min_group_error(devices: int, who: str) -> str | None:
    """One line when a secure group of ``devices`` devices is too small (None: it is not)."""
    if devices >= MIN_GROUP:
        return None
    return (f"{who}: a secure group needs at least {MIN_GROUP} devices (a group's sum of one device is "
            f"its update), got {devices}")
