"""Which topic an endpoint publishes to for a peer, and what an incoming topic is.

A device endpoint's only peer is the server (``"server"``): it publishes on its own ``up``
topics and hears its ``down`` topics, the server's status and (fleet topics only) the
server's epoch. The server's endpoint hears every device's ``up``, ``up/chunk`` and
``status`` topics and publishes on each device's ``down`` topics.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.pair_topics import PairTopics
from ..protocol.topics import FleetTopics

SERVER = "server"  # the peer name a device uses for the server


@dataclass(frozen=True)
class Routes:
    """Topic routing of one endpoint: ``device_id`` None is the server's side."""

    topics: FleetTopics | PairTopics
    device_id: str | None = None

    def classify(self, topic: str) -> tuple[str, str]:
        """(peer, "control" | "chunk" | "status" | "epoch") of an incoming topic; ValueError otherwise."""
        t = self.topics
        if self.device_id is not None:
            kinds = {
                t.down(self.device_id): "control",
                t.down_chunk(self.device_id): "chunk",
                t.server_status: "status",
            }
            if isinstance(t, FleetTopics):  # pairing topics have no epoch
                kinds[t.server_epoch] = "epoch"
            if topic not in kinds:
                raise ValueError(topic)
            return SERVER, kinds[topic]
        peer, rest = t.parse_device_topic(topic)
        kind = {"up": "control", "up/chunk": "chunk", "status": "status"}.get(rest)
        if kind is None:
            raise ValueError(topic)
        return peer, kind

    def control_topic(self, peer: str) -> str:
        """Where control messages for ``peer`` go."""
        return self.topics.up(self.device_id) if self.device_id is not None else self.topics.down(peer)

    def chunk_topic(self, peer: str) -> str:
        """Where blob chunks for ``peer`` go."""
        if self.device_id is not None:
            return self.topics.up_chunk(self.device_id)
        return self.topics.down_chunk(peer)
