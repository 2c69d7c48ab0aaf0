"""Encoding helpers for the JSON stage messages: base64 bytes, checked lengths."""

from __future__ import annotations

import base64
import binascii


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, length: int | None = None, what: str = "value") -> bytes:
    """Bytes of a base64 string; ValueError when not base64 or (``length``) of another size."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a base64 string")
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not base64") from None
    if length is not None and len(data) != length:
        raise ValueError(f"{what} must be {length} bytes, got {len(data)}")
    return data


def threshold(k: int, fraction: float) -> int:
    """t of a device's k neighbours whose shares rebuild its secrets: ``floor(fraction * k) + 1``,
    at most k. With fraction >= 0.5, t > k / 2: honest devices reveal one of a device's two
    secrets each, so the server can never gather t shares of both."""
    return min(k, int(fraction * k) + 1)
