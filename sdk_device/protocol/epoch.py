"""The server epoch (docs/protocol.md §3.1): who the server is right now, and how fast a fleet
may say hello to it.

The server publishes one retained JSON object on ``fedsdk/v1/<fleet>/broadcast/epoch``::

    {"epoch": "<32 lowercase hex>", "started_at": <unix seconds>, "announce_window_s": <seconds>}

``epoch`` is random per server instance (a restarted server has a new one). A device that
sees it change says ``hello`` again after a uniformly random delay in
``[0, announce_window_s]``, so a restart does not make the whole fleet hello at once.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass

from . import wire_json
from .errors import ProtocolError

MAX_EPOCH_BYTES = 1024
ANNOUNCE_RATE_PER_S = 333.0  # hellos per second a server is asked to absorb: 10,000 devices in 30 s
MIN_ANNOUNCE_WINDOW_S = 1.0
MAX_ANNOUNCE_WINDOW_S = 300.0
DEFAULT_ANNOUNCE_WINDOW_S = 30.0  # when the server's epoch does not say
_EPOCH = re.compile(r"[0-9a-f]{1,64}")


def announce_window(registered_devices: int) -> float:
    """The spread (seconds) the reference server asks for: one hello per 3 ms on average,
    at least 1 s, at most 300 s (10,000 devices: 30 s; 100: 1 s)."""
    return min(MAX_ANNOUNCE_WINDOW_S, max(MIN_ANNOUNCE_WINDOW_S, registered_devices / ANNOUNCE_RATE_PER_S))


@dataclass(frozen=True)
class ServerEpoch:
    """One server instance: its random id, start time and the hello spread it asks for."""

    epoch: str
    started_at: float
    announce_window_s: float

    @classmethod
    def new(cls, announce_window_s: float) -> ServerEpoch:
        return cls(secrets.token_hex(16), time.time(), float(announce_window_s))

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "started_at": self.started_at,
                           "announce_window_s": self.announce_window_s}, separators=(",", ":")).encode()

    @classmethod
    def of_status(cls, epoch: str, started_at: float, announce_window_s: float) -> ServerEpoch:
        """The epoch a ``server_status`` answer names (§3.2; fields already validated), the
        window clamped like a broadcast one's."""
        return cls(epoch, float(started_at),
                   min(MAX_ANNOUNCE_WINDOW_S, max(0.0, float(announce_window_s))))

    @classmethod
    def decode(cls, payload: bytes) -> ServerEpoch:
        """Parse a retained epoch payload; ProtocolError("malformed" / "invalid_field")."""
        if len(payload) > MAX_EPOCH_BYTES:
            raise ProtocolError("too_large", f"epoch payload of {len(payload)} bytes")
        try:
            body = wire_json.loads(payload)
        except ValueError as exc:
            raise ProtocolError("malformed", f"epoch payload is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ProtocolError("malformed", "epoch payload is not a JSON object")
        epoch = body.get("epoch")
        if not isinstance(epoch, str) or not _EPOCH.fullmatch(epoch):
            raise ProtocolError("invalid_field", "epoch must be 1-64 lowercase hex digits")
        started = body.get("started_at", 0.0)
        window = body.get("announce_window_s", DEFAULT_ANNOUNCE_WINDOW_S)
        for name, value in (("started_at", started), ("announce_window_s", window)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProtocolError("invalid_field", f"{name} must be a finite number")
        return cls.of_status(epoch, started, window)
