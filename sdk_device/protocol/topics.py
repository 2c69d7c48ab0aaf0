"""Topic layout of the wire protocol (the topic namespace `fedsdk/v1/`, unchanged in v2).

Everything lives under ``fedsdk/v1/<fleet>/``::

    fedsdk/v1/<fleet>/server/status          retained "online"/"offline" (last will)
    fedsdk/v1/<fleet>/broadcast/epoch        retained server epoch (JSON, ``protocol.epoch``)
    fedsdk/v1/<fleet>/dev/<id>/status        retained "online"/"offline" (last will)
    fedsdk/v1/<fleet>/dev/<id>/up            device -> server control messages (JSON)
    fedsdk/v1/<fleet>/dev/<id>/down          server -> device control messages (JSON)
    fedsdk/v1/<fleet>/dev/<id>/up/chunk      device -> server blob chunks (binary)
    fedsdk/v1/<fleet>/dev/<id>/down/chunk    server -> device blob chunks (binary)

A device only ever touches its own ``dev/<id>`` subtree and reads the server status; with
broker security on, per-device accounts and an ACL enforce it (``server_toolkit/broker/security.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROTOCOL_VERSION = 1
ROOT = f"fedsdk/v{PROTOCOL_VERSION}"

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a safe topic level (letters, digits, ``_.-``, 1-64 chars)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid {kind} {name!r}: use 1-64 letters, digits, '_', '.' or '-'"
        )
    return name


@dataclass(frozen=True)
class FleetTopics:
    """Topic names of one fleet."""

    fleet: str

    def __post_init__(self) -> None:
        check_name("fleet name", self.fleet)

    @property
    def base(self) -> str:
        return f"{ROOT}/{self.fleet}"

    @property
    def server_status(self) -> str:
        return f"{self.base}/server/status"

    @property
    def server_epoch(self) -> str:
        """Retained JSON naming the running server instance (``protocol.epoch``). Under
        ``broadcast/``, which device accounts may already read (broker ACL)."""
        return f"{self.base}/broadcast/epoch"

    def device_base(self, device_id: str) -> str:
        return f"{self.base}/dev/{check_name('device id', device_id)}"

    def device_status(self, device_id: str) -> str:
        return f"{self.device_base(device_id)}/status"

    def up(self, device_id: str) -> str:
        return f"{self.device_base(device_id)}/up"

    def down(self, device_id: str) -> str:
        return f"{self.device_base(device_id)}/down"

    def up_chunk(self, device_id: str) -> str:
        return f"{self.device_base(device_id)}/up/chunk"

    def down_chunk(self, device_id: str) -> str:
        return f"{self.device_base(device_id)}/down/chunk"

    # Subscriptions of the server: every device's upward traffic and status.
    @property
    def server_subscriptions(self) -> list[str]:
        return [
            f"{self.base}/dev/+/up",
            f"{self.base}/dev/+/up/chunk",
            f"{self.base}/dev/+/status",
        ]

    def device_subscriptions(self, device_id: str) -> list[str]:
        # the epoch before the status: its retained copy then arrives first (§3.1)
        return [self.down(device_id), self.down_chunk(device_id), self.server_epoch, self.server_status]

    def parse_device_topic(self, topic: str) -> tuple[str, str]:
        """Split ``…/dev/<id>/<rest>`` into ``(device_id, rest)``; ValueError otherwise."""
        prefix = f"{self.base}/dev/"
        if not topic.startswith(prefix):
            raise ValueError(f"not a device topic of fleet {self.fleet!r}: {topic!r}")
        device_id, _, rest = topic[len(prefix):].partition("/")
        check_name("device id", device_id)
        return device_id, rest
