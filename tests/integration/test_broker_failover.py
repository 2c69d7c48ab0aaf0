"""A broker URL naming several nodes (docs/protocol.md §4): the link connects to the first that
answers and, when it loses its node, reconnects to the next — two real mosquittos stand in for
the nodes of a cluster."""

from __future__ import annotations

import threading
import time

import pytest

from sdk_device.transport.broker_address import BrokerAddress
from sdk_device.transport.mqtt_link import MqttLink
from server_toolkit.broker.mosquitto import MosquittoBroker, free_port

pytestmark = pytest.mark.integration


def test_a_link_skips_a_dead_node_and_moves_to_the_next_when_its_node_dies(tmp_path):
    first = MosquittoBroker(workdir=tmp_path / "a").start()
    second = MosquittoBroker(workdir=tmp_path / "b").start()
    dead = free_port()
    try:
        url = f"mqtt://127.0.0.1:{dead},127.0.0.1:{first.port},127.0.0.1:{second.port}"
        got, arrived = [], threading.Event()
        link = MqttLink(BrokerAddress.parse(url), "failover-test",
                        lambda t, p: (got.append(p), arrived.set()), subscriptions=["probe/#"])
        link.connect(timeout_s=10)
        assert link.connected and link._client._port == first.port  # the dead node was skipped
        first.stop(kill=True)
        deadline = time.monotonic() + 30
        while link.connects < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert link.connects == 2 and link._client._port == second.port
        link.publish("probe/x", b"on the next node")
        assert arrived.wait(10) and got == [b"on the next node"]  # subscriptions renewed there
        link.close()
    finally:
        first.stop()
        second.stop()
