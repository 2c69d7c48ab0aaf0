"""Secure aggregation as a layer of the aggregation stack (``rounds/aggregator.py``).

With ``--secagg`` the grid runs each round as a secure aggregation (``secagg/mqtt_grid.py``):
its updates carry metrics only and its exchange carries the unmasked sum's turn into the next
global weights (``Exchange.secure``). This layer, the top of the stack, takes that; the layers
below never see an update in the clear (and a failed secure round brings no update at all).
A sum of clipped deltas (central DP: recipe ``dp_secure_clip``) is not a mean: it goes down to
the privacy layer, which noises it (``privacy/layer.py``).

Async mode (``edges_only``): a secure sum needs a cohort that agreed keys before training, and
a buffer fills with whoever arrives, so the server itself runs no secure round; only edges
that sum their groups securely (hello profile ``secagg: true``, ``edge/secure_group.py``) get
tasks, and their partials fold into the buffer. Any other device or edge is left out, with an
error in the log (it would send its update in the clear).
"""

from __future__ import annotations

import logging

from ..methods.base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..rounds.aggregator import Aggregator, RoundInput
from .aggregate import UnmaskedSum
from .mqtt_grid import SECURE_EDGE

log = logging.getLogger(__name__)


def is_secure_edge(device: DeviceInfo) -> bool:
    """Whether ``device`` is an edge that sums its group securely (its hello profile says so)."""
    return device.profile.get("role") == "edge" and device.profile.get(SECURE_EDGE) is True


class SecureSum(Aggregator):
    """The next global weights from the grid's secure sum when the round has one
    (``edges_only``: async mode, see the module docstring)."""

    def __init__(self, inner: Aggregator, edges_only: bool = False) -> None:
        super().__init__(inner)
        self.edges_only = edges_only

    def configure(self, rnd: int, global_weights: Weights,
                  devices: list[DeviceInfo]) -> list[TrainInstruction]:
        if self.edges_only:
            for device in devices:
                if not is_secure_edge(device):
                    log.error("version %d: %s left out: under --secagg in async mode only edges started "
                              "with --secagg get tasks (a device would send its update in the clear)",
                              rnd, device.device_id)
            devices = [d for d in devices if is_secure_edge(d)]
        return self.inner.configure(rnd, global_weights, devices) if devices else []

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        secure = info.exchange.secure if info.exchange is not None else None
        if secure is None or (isinstance(secure, UnmaskedSum) and secure.of_deltas):
            return self.inner.aggregate(rnd, global_weights, updates, info)
        return secure(self.method, rnd, global_weights)
