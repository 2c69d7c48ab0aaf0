"""Is a port free, and does an MQTT broker answer on it? Asked before anything starts, so a
busy port or a missing broker is one line instead of a traceback half a minute later."""

from __future__ import annotations

import socket

# An MQTT 3.1.1 CONNECT: clean session, keep-alive 10 s, client id "fedsdk-probe".
_CLIENT_ID = b"fedsdk-probe"
_VARIABLE = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(_CLIENT_ID).to_bytes(2, "big") + _CLIENT_ID
_CONNECT = bytes([0x10, len(_VARIABLE)]) + _VARIABLE
_CONNACK = 0x20


def port_in_use(host: str, port: int) -> bool:
    """Whether a listening socket holds ``host:port`` (a bind fails; TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def broker_problem(host: str, port: int, tls: bool = False, timeout_s: float = 1.5) -> str | None:
    """None when an MQTT broker answers a CONNECT on ``host:port`` (any CONNACK, even a refusal:
    accounts are checked later), else what is wrong, in a few words. With ``tls`` only the TCP
    connection is tried (the handshake needs the run's certificates)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        return f"nothing listens on {host}:{port} ({exc.strerror or exc})"
    with sock:
        if tls:
            return None
        try:
            sock.settimeout(timeout_s)
            sock.sendall(_CONNECT)
            first = sock.recv(1)
        except OSError:
            first = b""
        if not first or first[0] != _CONNACK:
            return f"{host}:{port} accepts connections but does not answer as an MQTT broker"
        sock.sendall(b"\xe0\x00")  # DISCONNECT
    return None
