"""A mosquitto process that enforces a broker security directory (accounts, ACL, TLS).

``start_secured_broker(DIR)`` is what ``fedsdk-server broker --mosquitto --security-dir DIR``
runs; ``make_secured_broker(root, fleet, tls=...)`` builds a throw-away one for tests
(fixtures ``secured_mosquitto`` / ``secured_mosquitto_tls`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sdk_device.transport.mqtt_link import BrokerAddress

from .certs import CertFiles, init_certs, server_hosts
from .mosquitto import MosquittoBroker, free_port
from .mosquitto_auth import STATE_FILE, MosquittoAuthFiles


@dataclass
class SecuredBroker:
    """A running mosquitto and the security backend that manages its accounts."""

    broker: MosquittoBroker
    security: MosquittoAuthFiles

    @property
    def address(self) -> BrokerAddress:
        """Where clients on this machine connect (``security.broker``)."""
        assert self.security.broker is not None
        return self.security.broker

    @property
    def url(self) -> str:
        return self.address.url

    @property
    def fleet(self) -> str:
        return self.security.fleet

    @property
    def ca_file(self) -> str | None:
        return self.security.ca_file

    def stop(self) -> None:
        self.broker.stop()

    def __enter__(self) -> SecuredBroker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def local_address(security_dir: str | Path) -> tuple[BrokerAddress, str | None]:
    """How a client on the broker's own machine reaches it: ``(address, CA file or None)``.

    A listener on all interfaces (``0.0.0.0``/``::``) is reached on 127.0.0.1, which
    ``certs init`` puts in the server certificate by default.
    """
    state = json.loads((Path(security_dir) / STATE_FILE).read_text())
    host = state["listener"]["host"]
    tls_dir = state.get("tls_dir")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
        if tls_dir:  # a name the certificate is valid for, loopback ones first
            names = server_hosts(CertFiles(Path(tls_dir)))
            host = next((n for n in ("127.0.0.1", "localhost", "::1") if n in names), names[0])
    address = BrokerAddress(host, int(state["listener"]["port"]), tls=tls_dir is not None)
    return address, str(CertFiles(Path(tls_dir)).ca_pem) if tls_dir else None


def start_secured_broker(security_dir: str | Path, workdir: str | Path | None = None) -> SecuredBroker:
    """Start mosquitto with the listener, accounts and certificates of ``security_dir``."""
    security_dir = Path(security_dir)
    state = json.loads((security_dir / STATE_FILE).read_text())
    tls_dir = state.get("tls_dir")
    if tls_dir:
        CertFiles(Path(tls_dir)).check()
    broker = MosquittoBroker(
        port=int(state["listener"]["port"]),
        host=state["listener"]["host"],
        workdir=workdir or security_dir / "data",
        security_dir=security_dir,
        tls_dir=tls_dir,
    ).start()
    address, ca_file = local_address(security_dir)
    return SecuredBroker(broker, MosquittoAuthFiles(security_dir, broker=address, ca_file=ca_file))


def make_secured_broker(root: str | Path, fleet: str, tls: bool = False) -> SecuredBroker:
    """A fresh secured mosquitto on a free loopback port, all files under ``root``.

    With ``tls`` a CA and a server certificate for 127.0.0.1/localhost are made in
    ``root/certs`` and the listener speaks only TLS (``mqtts://``).
    """
    root = Path(root)
    tls_dir = init_certs(root / "certs", ["localhost", "127.0.0.1"]).directory if tls else None
    MosquittoAuthFiles.create(root / "security", fleet, listener={"host": "127.0.0.1", "port": free_port()},
                              tls_dir=tls_dir)
    return start_secured_broker(root / "security", workdir=root / "mosquitto")


def server_connection(
    security_dir: str | Path, broker_url: str | None = None, ca_file: str | None = None
) -> tuple[BrokerAddress, str | None, MosquittoAuthFiles]:
    """What ``fedsdk-server run --security-dir DIR`` connects with.

    Returns ``(address, CA file, security)``: ``broker_url`` (default: the directory's own
    listener, reached locally) and ``ca_file`` (default: the directory's CA); the security
    backend confirms account changes against that address. The address carries no
    credentials: use ``security.server_credentials()``.
    """
    local, local_ca = local_address(security_dir)
    address = BrokerAddress.parse(broker_url) if broker_url else local
    ca_file = ca_file or (local_ca if address.tls else None)
    return address, ca_file, MosquittoAuthFiles(security_dir, broker=address, ca_file=ca_file)
