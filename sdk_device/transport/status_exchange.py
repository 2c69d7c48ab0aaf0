"""The status request of docs/protocol.md §3.2, on paho's thread (the round loop may be busy).

The server answers a device's ``status_request`` with a ``server_status`` naming its epoch
(nothing before it has one); a device hands the answer to its announcer as a retained epoch
and a retained ``online`` would arrive: the server's own word at our connect, which a broker
without retained messages, or with per-node or stale ones, cannot give.
"""

from __future__ import annotations

from typing import Any

from ..protocol import messages as msgs
from ..protocol.epoch import ServerEpoch


def status_exchange(endpoint: Any, peer: str, message: msgs.Message) -> None:
    """Answer a ``status_request`` (server side) or report a ``server_status`` (device side).
    ``endpoint``: the ``Endpoint`` it arrived at (not imported here: no import cycle)."""
    if isinstance(message, msgs.StatusRequest):
        epoch = getattr(endpoint, "epoch", None)  # set by announce_epoch (a server's grid)
        if endpoint.device_id is None and epoch is not None:
            endpoint.send(peer, msgs.ServerStatus(epoch=epoch.epoch, started_at=epoch.started_at,
                                                  announce_window_s=epoch.announce_window_s))
    elif isinstance(message, msgs.ServerStatus) and endpoint.device_id is not None:
        epoch = ServerEpoch.of_status(message.epoch, message.started_at, message.announce_window_s)
        endpoint._server_event("epoch", epoch, True)
        endpoint._server_event("status", "online", True)
