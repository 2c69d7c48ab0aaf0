"""Topic layout of pairing: fleet-less, one subtree per pairing client (topic namespace v1).

::

    fedsdk/v1/pair/<client id>/req          pairing client -> server control messages (JSON)
    fedsdk/v1/pair/<client id>/resp         server -> pairing client control messages (JSON)
    fedsdk/v1/pair/<client id>/req/chunk    pairing client -> server blob chunks (unused today)
    fedsdk/v1/pair/<client id>/resp/chunk   server -> pairing client blob chunks (the fleet's model)
    fedsdk/v1/pair/<client id>/status       retained "online"/"offline" of the client (last will)
    fedsdk/v1/pair/_server/status           retained "online"/"offline" of the pairing server

The pairing account (``fedsdk-pair``, public password) may only touch
``fedsdk/v1/pair/<its own MQTT client id>/#``, so the client id *is* the subtree: a client
picks a random one (``new_client_id``) and nobody else can read the credentials it receives.
``PairTopics`` has the same methods as ``FleetTopics`` (device id = client id), so the
ordinary ``Endpoint`` (validated messages, blob pulls) runs pairing unchanged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .topics import ROOT, check_name

PAIR_ROOT = f"{ROOT}/pair"
PAIR_USERNAME = "fedsdk-pair"  # the shared account pairing clients log in with
PAIR_PASSWORD = "fedsdk-pair"  # public by design: the broker's ACL confines the account
SERVER_LEVEL = "_server"  # never a client id: new_client_id makes "pair-<hex>"


def new_client_id() -> str:
    """A fresh, unguessable MQTT client id for one pairing session (128 random bits)."""
    return f"pair-{secrets.token_hex(16)}"


@dataclass(frozen=True)
class PairTopics:
    """The pairing topics, shaped like ``FleetTopics`` (a "device" is a pairing client id)."""

    fleet: str = "pair"  # only used to name MQTT client ids

    @property
    def base(self) -> str:
        return PAIR_ROOT

    @property
    def server_status(self) -> str:
        return f"{PAIR_ROOT}/{SERVER_LEVEL}/status"

    def device_base(self, client_id: str) -> str:
        if check_name("pairing client id", client_id) == SERVER_LEVEL:
            raise ValueError(f"{SERVER_LEVEL!r} is reserved")
        return f"{PAIR_ROOT}/{client_id}"

    def device_status(self, client_id: str) -> str:
        return f"{self.device_base(client_id)}/status"

    def up(self, client_id: str) -> str:
        return f"{self.device_base(client_id)}/req"

    def down(self, client_id: str) -> str:
        return f"{self.device_base(client_id)}/resp"

    def up_chunk(self, client_id: str) -> str:
        return f"{self.device_base(client_id)}/req/chunk"

    def down_chunk(self, client_id: str) -> str:
        return f"{self.device_base(client_id)}/resp/chunk"

    @property
    def server_subscriptions(self) -> list[str]:
        return [f"{PAIR_ROOT}/+/req", f"{PAIR_ROOT}/+/req/chunk"]

    def device_subscriptions(self, client_id: str) -> list[str]:
        # The pairing account cannot read the server status (outside its subtree).
        return [self.down(client_id), self.down_chunk(client_id)]

    def parse_device_topic(self, topic: str) -> tuple[str, str]:
        """``…/pair/<client id>/<rest>`` -> ``(client id, rest)`` with rest "up", "up/chunk"
        or "status" (the names ``Endpoint`` routes by); ValueError otherwise."""
        prefix = f"{PAIR_ROOT}/"
        if not topic.startswith(prefix):
            raise ValueError(f"not a pairing topic: {topic!r}")
        client_id, _, rest = topic[len(prefix) :].partition("/")
        if check_name("pairing client id", client_id) == SERVER_LEVEL:
            raise ValueError("the server's own topic")
        rest = {"req": "up", "req/chunk": "up/chunk", "status": "status"}.get(rest)
        if rest is None:
            raise ValueError(f"not a pairing request topic: {topic!r}")
        return client_id, rest
