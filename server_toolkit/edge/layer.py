"""Edge folding as a layer of the aggregation stack (``rounds/aggregator.py``).

Edges say hello on their own (a profile with ``role: "edge"``), so every server stack holds
this layer; with no edge in a round each call goes down unchanged. ``configure`` sends a
generic edge the global model and expands a bundle edge into its members (``edge/fold.py``,
``edge/bundle.py``); ``finish`` stamps a bundle's members as direct devices; ``unpack``
turns a bundle's result into its members' updates; ``aggregate`` folds the edges' partial
aggregates with the devices' summands (``edge/partial.py``) when an edge answered, else the
layer below aggregates. A method that folds edges itself (an edge's ``SumRelay``) is passed
straight down.

``forward``: every edge is asked to forward its members' updates (a bundle) instead of their
sum, because a layer above needs each device's own update: central DP clips each one, a
median needs every value, local DP and label noise are per device. The server then sees the
flat round (exact, at the bytes of a flat round on the edge's uplink); a member that is an
edge itself is left out (no bundles of bundles: one edge level).
"""

from __future__ import annotations

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..rounds.aggregator import Aggregator, Finish, MethodAggregate, RoundInput
from ..rounds.norm_bound import DEFAULT_FACTOR, NormBound
from . import bundle
from .fold import configure, fold, is_partial
from .partial import devices_behind


class EdgeFold(Aggregator):
    """Generic and bundle edges around the layer below (``forward``: see the module docstring)."""

    def __init__(self, inner: Aggregator, forward: bool = False) -> None:
        super().__init__(inner)
        self.forward = forward

    def configure(self, rnd: int, global_weights: Weights,
                  devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return configure(self.method, rnd, global_weights, devices, self.forward)

    def finish(self, instruction: TrainInstruction, again: Finish) -> TrainInstruction:
        return bundle.finish_members(self.inner.finish(instruction, again), again)

    def unpack(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        return self.inner.unpack(bundle.unpack(updates))

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        if self.method.folds_edges or not any(is_partial(u) for u in updates):
            return self.inner.aggregate(rnd, global_weights, updates, info)
        return fold(self.method, global_weights, updates).finish(global_weights)

    def carried(self, update: ClientUpdate) -> int:
        return devices_behind(update.metrics) if is_partial(update) else self.inner.carried(update)

    def is_partial(self, update: ClientUpdate) -> bool:
        return is_partial(update) or self.inner.is_partial(update)


def edge_stack(method: Method, norm_bound: float | None = DEFAULT_FACTOR) -> Aggregator:
    """The stack of a run with edges and no other aggregation feature (an edge's own group
    round): the norm bound (when set and the method ``bounds_updates``) over ``EdgeFold``."""
    stack: Aggregator = EdgeFold(MethodAggregate(method))
    return NormBound(stack, norm_bound) if norm_bound is not None and method.bounds_updates else stack
