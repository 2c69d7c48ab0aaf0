"""``fedsdk-server broker``: a broker in the foreground (embedded amqtt or mosquitto)."""

from __future__ import annotations

from pathlib import Path

import click

from sdk_device.transport.tls import is_loopback

from .options import console


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=1883, show_default=True)
@click.option("--insecure-embedded-broker", is_flag=True, help="Allow a non-loopback --host.")
@click.option("--mosquitto", "use_mosquitto", is_flag=True, help="Run mosquitto instead of amqtt.")
@click.option(
    "--security",
    "security_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="With --mosquitto: enforce this broker security directory (accounts, ACL, TLS, listener).",
)
def broker(host, port, insecure_embedded_broker, use_mosquitto, security_dir) -> None:
    """Run a broker in the foreground: embedded amqtt (loopback trials) or mosquitto."""
    import signal
    import sys
    import time

    from ..broker.embedded import EmbeddedBroker, refuse_secured_mode
    from ..broker.mosquitto import MosquittoBroker
    from ..broker.secured import start_secured_broker

    try:
        if security_dir and not use_mosquitto:
            refuse_secured_mode()
        if security_dir:
            b = start_secured_broker(security_dir).broker
        elif use_mosquitto:
            if not is_loopback(host):
                raise ValueError(f"an anonymous mosquitto on {host} would let anyone in: "
                                 "use --security DIR (fedsdk-server security init)")
            b = MosquittoBroker(port, host).start()
        else:
            b = EmbeddedBroker(host, port, allow_remote=insecure_embedded_broker).start()
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    kind = "mosquitto" + (f" (accounts and ACL of {security_dir})" if security_dir else "")
    console.print(f"{kind if use_mosquitto else 'embedded broker'} on {b.address.url}; Ctrl-C stops it")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the child broker on SIGTERM too
    try:
        while b.proc and b.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


