"""Where the dashboard listens and who may read it.

Bound to a loopback address it is open to this machine's users; bound to any other address it
needs a token: given (``--dashboard-token``) or generated here and printed once. A request shows
the token as ``Authorization: Bearer <token>`` (what Prometheus' ``authorization`` sends) or as
``?token=<token>`` (what a browser's address bar keeps).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass


class DashboardError(Exception):
    """The dashboard cannot start; the message is one line."""


@dataclass(frozen=True)
class Bind:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything

    def url(self, token: str | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "::") else host
        return f"http://{shown}:{self.port}/" + (f"?token={token}" if token else "")


def parse_bind(text: str) -> Bind:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) or just ``PORT`` (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise DashboardError(f"--dashboard {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return Bind(host, int(port))


def decide_token(bind: Bind, given: str | None) -> str | None:
    """The token requests need: ``given``, else a new one off loopback, else None (open)."""
    if given:
        return given
    return None if bind.loopback else secrets.token_urlsafe(18)


def authorized(token: str | None, header: str | None, query: str | None) -> bool:
    """True when no token is needed or the request shows it (compared in constant time)."""
    if token is None:
        return True
    shown = header[7:] if header and header.lower().startswith("bearer ") else query
    return shown is not None and hmac.compare_digest(shown.encode(), token.encode())
