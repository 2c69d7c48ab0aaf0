"""Where generic edges meet a method: the round loop's two calls, edge-aware.

A device whose hello profile says ``{"role": "edge", "aggregates": "sums", "method": M}``
is a generic edge aggregator (``edge/sum_relay.py``). ``configure`` gives the other devices
the method's own instructions and every such edge the *global* model (spec, weights and the
method's recipe) plus a ``coverage`` record to fill; ``aggregate`` folds the edges' partial
aggregates and the direct devices' summands into one ``Partial`` and finishes it
(``edge/partial.py``). With no edge in the round both calls are the method's own, unchanged.

Bundle edges (an edge that forwards each member's update, for methods that are not sums)
are expanded into their members around both calls (``edge/bundle.py``).

A method that does this itself (an edge's ``SumRelay``: ``folds_edges = True``) is called
straight through. An edge is left out of the round, with an error in the log, when the method is not a sum
(``methods/summands.py``) or the edge runs another method than the server.
"""

from __future__ import annotations

import logging

import numpy as np

from fedcore import modelspec

from ..methods.base import MODEL, ClientUpdate, DeviceInfo, Method, ModelRecord, TrainInstruction, Weights
from ..methods.summands import refusal
from . import bundle
from .partial import COVERAGE, Partial

log = logging.getLogger(__name__)

SUMS = "sums"  # profile["aggregates"] of a generic edge, context["edge"] of its instruction


def is_sum_edge(device: DeviceInfo) -> bool:
    """Whether ``device`` is a generic edge (it answers with a partial aggregate)."""
    return device.profile.get("role") == "edge" and device.profile.get("aggregates") == SUMS


def is_partial(update: ClientUpdate) -> bool:
    """Whether ``update`` is an edge's partial aggregate (``model`` = mean, ``coverage`` = A)."""
    return update.instruction.context.get("edge") == SUMS


def configure(method: Method, rnd: int, global_weights: Weights, devices: list[DeviceInfo],
              forward: bool = False) -> list[TrainInstruction]:
    """``method.configure_train`` for the devices and bundle edges' members (one bundle per
    edge), the global model for the generic edges; ``forward``: every edge listing members is
    a bundle edge (``edge/bundle.py``)."""
    devices, owners = bundle.expand(method, rnd, devices, forward)
    return bundle.pack(method, rnd, _configure(method, rnd, global_weights, devices), owners)


def _configure(method: Method, rnd: int, global_weights: Weights,
               devices: list[DeviceInfo]) -> list[TrainInstruction]:
    edges = [d for d in devices if is_sum_edge(d)]
    if not edges or method.folds_edges:
        return method.configure_train(rnd, global_weights, devices)
    direct = [d for d in devices if not is_sum_edge(d)]
    reason = refusal(method)
    usable = []
    for edge in edges:
        if reason is not None:
            log.error("round %d: edge %s left out: %s", rnd, edge.device_id, reason)
        elif edge.profile.get("method") != method.name:
            log.error("round %d: edge %s left out: it runs method %r, the server %r", rnd, edge.device_id,
                      edge.profile.get("method"), method.name)
        else:
            usable.append(edge)
    out = method.configure_train(rnd, global_weights, direct) if direct else []
    return out + [edge_instruction(method, global_weights, e.device_id) for e in usable]


def edge_instruction(method: Method, global_weights: Weights, device_id: str) -> TrainInstruction:
    """What a generic edge is sent: the global model (its spec as the only program) and the
    method's recipe; it returns ``model`` (its group's mean) and ``coverage`` (float32 A)."""
    spec = method.global_spec
    zeros = {name: np.zeros(value.shape, np.float32) for name, value in global_weights.items()}
    return TrainInstruction(device_id, spec, global_weights, method.recipe, context={"edge": SUMS},
                            models={COVERAGE: ModelRecord(spec, zeros)}, returns=(MODEL, COVERAGE),
                            programs=((modelspec.FORMAT, modelspec.dumps(spec)),))


def fold(method: Method, global_weights: Weights, updates: list[ClientUpdate]) -> Partial:
    """One ``Partial`` of every update: the edges' partials and the devices' summands."""
    partial = Partial()
    for update in updates:
        if is_partial(update):
            partial.add_partial(update.weights, update.others[COVERAGE])
        else:
            partial.add(global_weights, method.summands(global_weights, update))
    return partial


def aggregate(method: Method, rnd: int, global_weights: Weights, updates: list[ClientUpdate]) -> Weights:
    """``method.aggregate_train``, or the fold of the round when an edge answered in it."""
    updates = bundle.unpack(updates)
    if not any(is_partial(u) for u in updates) or method.folds_edges:
        return method.aggregate_train(rnd, global_weights, updates)
    return fold(method, global_weights, updates).finish(global_weights)
