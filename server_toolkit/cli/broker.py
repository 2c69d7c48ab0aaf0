"""``fedsdk-server broker``: a broker in the foreground (embedded amqtt or mosquitto)."""

from __future__ import annotations

from pathlib import Path

import click

from sdk_device.transport.tls import is_loopback

from .aliases import Aliased
from .options import console


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=1883, show_default=True, help="Port to listen on (refused when in use).")
@click.option("--insecure-embedded-broker", is_flag=True, help="Allow a non-loopback --host.")
@click.option("--mosquitto", "use_mosquitto", is_flag=True, help="Run mosquitto instead of amqtt.")
@click.option(
    "--security-dir",
    "--security",
    "security_dir",
    cls=Aliased,
    aliases=["--security"],
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
        refuse_busy(security_dir, host, port)
        if security_dir:
            b = start_secured_broker(security_dir).broker
        elif use_mosquitto:
            if not is_loopback(host):
                raise ValueError(f"an anonymous mosquitto on {host} would let anyone in: "
                                 "use --security-dir DIR (fedsdk-server security init)")
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




def refuse_busy(security_dir: Path | None, host: str, port: int) -> None:
    """ClickException (one line) when a broker already serves ``security_dir`` or holds the port:
    starting a second one would fail to listen, and a second mosquitto would delete the first
    one's pid file on its way out (``security grant`` then cannot reload it)."""
    from ..broker.mosquitto_auth import STATE_FILE, running_mosquitto
    from ..broker.ports import port_in_use

    if security_dir:
        pid = running_mosquitto(security_dir)
        if pid:
            raise click.ClickException(f"mosquitto (pid {pid}) already serves {security_dir}; stop it first "
                                       f"(kill {pid}) or use it as it is")
        import json

        try:
            listener = json.loads((security_dir / STATE_FILE).read_text())["listener"]
            host, port = listener["host"], int(listener["port"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"{security_dir / STATE_FILE} is missing or damaged ({exc}): "
                                       "make the directory with `fedsdk-server security init`") from None
    if port_in_use(host, port):
        raise click.ClickException(f"port {port} on {host} is in use (another broker?): choose another "
                                   "--port, or stop what listens there")
