"""Does an invalid control message claim to be an ``error``? (docs/protocol.md §5.2: a receiver
never answers an ``error`` with an ``error``, valid or not, so peers of different versions
cannot answer each other forever.) Re-exported as ``messages.says_error``."""

from __future__ import annotations

from . import wire_json

MAX_CLAIM_BYTES = 64 * 1024  # = messages.MAX_CONTROL_BYTES: a larger payload is not parsed at all


def says_error(payload: bytes) -> bool:
    """True when an (otherwise invalid) control message claims to be an ``error``, e.g. one
    of another schema version."""
    if len(payload) > MAX_CLAIM_BYTES:
        return False
    try:
        body = wire_json.loads(payload)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == "error"
