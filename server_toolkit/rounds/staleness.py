"""Buffered asynchronous aggregation maths (FedBuff; Nguyen et al., 2022): staleness weights
and folding a buffer of updates into the global model.

An update answers a task made from global version ``b`` (its *base*); it arrives while the
server is at version ``v``; its staleness is ``tau = v - b`` (versions published since its task
was made). Its delta is what the device changed, ``w_i - w_sent`` (``w_sent``: the weights its
task carried, the base version cut as the method cut it), scaled by the staleness weight
``s(tau) = 1 / sqrt(1 + tau)`` (FedBuff's default; ``s(0) = 1``).

Folding a buffer of K updates (``fold_buffer``): the method's own ``aggregate_train`` is run
on the scaled deltas with an all-zero "global model", and the server adds ``server_lr`` times
what it returns:

    w_new = w + server_lr * A(0, {s(tau_i) * (w_i - w_sent_i)})

For a method whose ``aggregate_train`` is, per element, an average of the updates with
coefficients that do not depend on the values and sum to one where anybody covers the
element (elements nobody covers keep the global value), ``A(0, .)`` is that average of the
deltas and 0 where nobody trained. So FedAvg folds ``sum_i n_i s_i delta_i / sum_i n_i``,
HeteroFL / FedRolex the same per element over the updates covering it, DepthFL per tensor
present (classifier rows per class). Decisions: the sample weights stay in the denominator
unscaled, so a stale update shrinks the step instead of being renormalised away (FedBuff
divides by K for the same reason); ``server_lr`` defaults to 1.0, where a buffer of fresh
updates (all tau = 0) gives exactly the synchronous round of the same updates. Methods
declare that their aggregation has this form with ``Method.weighted_sum``
(``methods/capability.py``).

Edge aggregators (``edge/``): an edge answers a task made from version ``b`` with its
group's partial aggregate (``model`` = the group's mean, the sent value where nobody covered
an element; ``coverage`` = A). Its delta ``mean - w_b`` (0 where uncovered), scaled by
``s(tau)``, joins the fold as a partial (``edge/fold.py``): ``sum_i a_i s_i delta_i`` and
``A`` add to the devices' summands, so a buffer holding it folds to what the flat buffer of
its members' updates (same base, same staleness) folds to. An edge's result counts as the
device updates it carries (``carried``) towards K and in the staleness statistics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..methods.base import ClientUpdate, Weights
from .aggregator import Aggregator, RoundInput

StalenessWeight = Callable[[int], float]
Aggregate = Callable[[int, Weights, list[ClientUpdate]], Weights]  # (round, global, updates) -> weights


def fedbuff_weight(staleness: int) -> float:
    """FedBuff's staleness weight ``1 / sqrt(1 + tau)`` for ``tau`` >= 0 versions."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    return 1.0 / math.sqrt(1.0 + staleness)


@dataclass(frozen=True)
class BufferedUpdate:
    """An accepted update waiting in the buffer: the update, the global version its task was
    made from (``base``) and its staleness when it arrived (versions, >= 0)."""

    update: ClientUpdate
    base: int
    staleness: int


def scaled_delta(update: ClientUpdate, scale: float) -> ClientUpdate:
    """``update`` whose ``"model"`` weights are ``scale * (returned - sent)`` in float64
    (tensors the task did not send are left out: they are not deltas)."""
    sent = update.instruction.weights
    delta = {name: scale * (value.astype(np.float64) - np.asarray(sent[name], np.float64))
             for name, value in update.weights.items() if name in sent}
    return dataclasses.replace(update, weights=delta)


def fold_buffer(aggregate: Aggregate, version: int, global_weights: Weights, buffer: list[BufferedUpdate],
                server_lr: float = 1.0, weight: StalenessWeight = fedbuff_weight) -> Weights:
    """The next global weights: ``w + server_lr * A(0, scaled deltas)`` (module docstring), ``A``
    = ``aggregate`` (the method's ``aggregate_train``, or the stack below ``StalenessFold``:
    with edges' partials, their fold). ``version`` is the version being made (its round)."""
    if not buffer:
        raise ValueError("nothing to fold: the buffer is empty")
    scaled = [scaled_delta(b.update, weight(b.staleness)) for b in
              sorted(buffer, key=lambda b: (b.update.device_id, b.base))]  # order-independent
    zeros = {name: np.zeros(value.shape, np.float64) for name, value in global_weights.items()}
    step = aggregate(version, zeros, scaled)  # the method's own; with partials, their fold
    out: Weights = {}
    for name, value in global_weights.items():
        if name not in step:  # a tensor no update holds: unchanged
            out[name] = value
            continue
        moved = value.astype(np.float64) + server_lr * step[name].astype(np.float64)
        out[name] = (np.rint(moved) if value.dtype.kind in "iu" else moved).astype(value.dtype)
    return out


def staleness_stats(buffer: list[BufferedUpdate],
                    carried: Callable[[ClientUpdate], int] = lambda u: 1) -> dict:
    """``staleness_mean`` and ``staleness_max`` of a folded buffer (versions), over the device
    updates it carries (``carried``: the aggregation stack's; an edge's staleness counts once
    per device behind it)."""
    counts = [carried(b.update) for b in buffer]
    total = sum(counts)
    return {"staleness_mean": sum(n * b.staleness for n, b in zip(counts, buffer, strict=True)) / total
            if total else 0.0, "staleness_max": max((b.staleness for b in buffer), default=0)}


class StalenessFold(Aggregator):
    """The stack's async layer (``rounds/aggregator.py``): a buffer of updates (``info.staleness``
    and ``info.bases`` per update) folded as ``fold_buffer`` does, the layers below aggregating
    the scaled deltas against an all-zero global model."""

    def __init__(self, inner: Aggregator, server_lr: float = 1.0) -> None:
        super().__init__(inner)
        self.server_lr = server_lr

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        staleness = info.staleness if info.staleness is not None else [0] * len(updates)
        bases = info.bases if info.bases is not None else [rnd - 1 - s for s in staleness]
        buffer = [BufferedUpdate(u, b, s) for u, b, s in zip(updates, bases, staleness, strict=True)]

        def below(version: int, zeros: Weights, scaled: list[ClientUpdate]) -> Weights:
            return self.inner.aggregate(version, zeros, scaled, info)

        return fold_buffer(below, rnd, global_weights, buffer, self.server_lr)
