"""mqtts://: the transport talks TLS to mosquitto and refuses a broker it does not trust."""

from __future__ import annotations

import os
import subprocess

import pytest

from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress
from server_toolkit.broker.mosquitto import MosquittoBroker

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca_and_server_cert(d) -> None:
    """A throw-away CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=fedsdk test CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
             "-out", "server.csr", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext.cnf", "-out", "server.crt", cwd=d)


def test_mqtts_with_a_trusted_ca_and_refusal_without(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    _make_ca_and_server_cert(certs)
    tls = f"cafile {certs}/ca.crt\ncertfile {certs}/server.crt\nkeyfile {certs}/server.key\n"
    with MosquittoBroker(workdir=tmp_path / "broker", extra_config=tls) as broker:
        address = BrokerAddress.parse(f"mqtts://127.0.0.1:{broker.port}")
        topics = FleetTopics("tls")
        server = Endpoint(address, topics, BlobStore(tmp_path / "s"), ca_file=str(certs / "ca.crt")).start()
        device = Endpoint(address, topics, BlobStore(tmp_path / "d"), device_id="d1",
                          ca_file=str(certs / "ca.crt")).start()
        data = os.urandom(300_000)
        assert device.fetch(SERVER, server.offer("d1", data, "weights", "safetensors")) == data
        device.close()
        server.close()

        stranger = Endpoint(address, topics, BlobStore(tmp_path / "x"), device_id="d2")  # system CAs only
        with pytest.raises(ConnectionError, match="cannot reach|refused"):
            stranger.start(timeout_s=5)
