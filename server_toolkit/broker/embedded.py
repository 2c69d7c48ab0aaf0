"""The embedded default broker: amqtt (pure Python, from PyPI) in a child process.

Why amqtt: it installs with pip on any machine (no system package), so
``fedsdk-server simulate`` works on a fresh machine. Its limits (measured here: MQTT
3.1.1 only, no packet-size/inflight/queue limits, keepalive not enforced so a vanished
device's last will may never fire, ``allow_anonymous: false`` accepted any password,
~70 MB/s) make it a loopback simulation broker only. It is therefore bound to 127.0.0.1
and refuses any other address unless the caller insists (``allow_remote=True``); real
fleets use mosquitto (``--broker mqtt://host:port``).

Run directly: ``python -m server_toolkit.broker.embedded --port 1883``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from sdk_device.transport.mqtt_link import BrokerAddress
from sdk_device.transport.tls import is_loopback

from .mosquitto import free_port, wait_for_port

__all__ = ["EmbeddedBroker", "is_loopback", "refuse_secured_mode"]

SECURED_MODE_REFUSAL = (
    "the embedded broker (amqtt 0.12) cannot run a secured fleet: its ACL plugin matches "
    "usernames only (no per-client-id rule, so the shared pairing account could read every "
    "device's pairing answer), it reads its password file once at start (a revoked device "
    "keeps its session and can reconnect until a restart), and with its default auth plugin "
    "allow_anonymous=false accepts any password. Use mosquitto: fedsdk-server broker --mosquitto "
    "--security-dir DIR."
)


def refuse_secured_mode() -> None:
    """Raise the reason the embedded broker has no secured mode (measured on amqtt 0.12.1:
    FileAuthPlugin refuses wrong passwords, but a ``fedsdk-pair`` client subscribed to
    ``fedsdk/v1/pair/+/#`` received another pairing client's answer, and
    AnonymousAuthPlugin(allow_anonymous=False) let ``d1`` in with a wrong password)."""
    raise ValueError(SECURED_MODE_REFUSAL)


class EmbeddedBroker:
    """An amqtt broker process on ``host:port`` (a free loopback port by default)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, allow_remote: bool = False) -> None:
        if not is_loopback(host) and not allow_remote:
            raise ValueError(
                f"the embedded broker (amqtt) is for loopback simulations only and will not bind {host}: "
                "it enforces no credentials, sizes or keepalives. Use mosquitto for devices on a "
                "network (--broker mqtt://host:port), or insist with --insecure-embedded-broker."
            )
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"fedsdk-amqtt-{self.port}.log"

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(self.host, self.port)

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        cmd = [sys.executable, "-m", "server_toolkit.broker.embedded", "--host", self.host,
               "--port", str(self.port)]
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for_port(self.host, self.port, timeout_s, self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def broker_config(host: str, port: int) -> dict:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def _serve(host: str, port: int) -> None:
    from amqtt.broker import Broker

    broker = Broker(broker_config(host, port))
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="fedsdk embedded MQTT broker (amqtt)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--insecure-allow-remote", action="store_true")
    args = parser.parse_args()
    if not is_loopback(args.host) and not args.insecure_allow_remote:
        parser.error("refusing to bind a non-loopback address without --insecure-allow-remote")
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
