"""Secure aggregation as a layer of the aggregation stack (``rounds/aggregator.py``).

With ``--secagg`` the grid runs each round as a secure aggregation (``secagg/mqtt_grid.py``):
its updates carry metrics only and its exchange carries the unmasked sum's turn into the next
global weights (``Exchange.secure``). This layer, the top of the stack, takes that; the layers
below never see an update in the clear (and a failed secure round brings no update at all).
"""

from __future__ import annotations

from ..methods.base import ClientUpdate, Weights
from ..rounds.aggregator import Aggregator, RoundInput


class SecureSum(Aggregator):
    """The next global weights from the grid's secure sum when the round has one."""

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        secure = info.exchange.secure if info.exchange is not None else None
        if secure is None:
            return self.inner.aggregate(rnd, global_weights, updates, info)
        return secure(self.method, rnd, global_weights)
