"""The C++ client on a broker without retained messages (mosquitto ``retain_available false``,
broker URL ``?retain=0``): it stays connected, asks for the server's status after its start
hello (docs/protocol.md §3.2), takes the answer as the epoch of the server its hello went to
(no second hello), and says hello again to a new epoch broadcast live."""

from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from sdk_device.protocol.topics import FleetTopics
from server_toolkit.broker.mosquitto import MosquittoBroker

from .cpp_client import start_client, write_data

pytestmark = pytest.mark.integration

TOPICS = FleetTopics("nr")


class PlainServer:
    """A paho client in the server's place that never sets the retain flag; keeps what arrives."""

    def __init__(self, port: int) -> None:
        self.received: list[dict] = []
        self.changed = threading.Condition()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fedsdk-server-nr",
                                  protocol=mqtt.MQTTv311)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(TOPICS.up("c1"), qos=1)
        self.client.loop_start()

    def _on_message(self, client, userdata, message) -> None:
        with self.changed:
            self.received.append(json.loads(message.payload))
            self.changed.notify_all()

    def count(self, kind: str) -> int:
        return sum(m.get("type") == kind for m in self.received)

    def wait(self, kind: str, count: int, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count(kind) >= count, timeout_s)

    def publish(self, topic: str, body: dict) -> None:
        self.client.publish(topic, json.dumps(body).encode(), qos=1).wait_for_publish(5)


def test_the_cpp_client_asks_for_the_servers_status_on_a_broker_without_retained_messages(
        cpp_device, tmp_path):
    broker = MosquittoBroker(workdir=tmp_path / "mosquitto", extra_config="retain_available false").start()
    server = PlainServer(broker.port)
    data = write_data(tmp_path / "data", np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64))
    proc = start_client(cpp_device, f"{broker.url}?retain=0", "nr", "c1", data, tmp_path / "work",
                        tmp_path / "device.log")
    try:
        assert server.wait("hello", 1, 30) and server.wait("status_request", 1, 10)
        epoch = {"epoch": uuid.uuid4().hex, "started_at": time.time(), "announce_window_s": 0.0}
        server.publish(TOPICS.down("c1"), {"schema": 2, "type": "server_status", "msg_id": uuid.uuid4().hex,
                                           "sent_at": time.time(), **epoch})
        time.sleep(2.0)
        assert server.count("hello") == 1  # the answer names the server its start hello went to
        assert server.count("error") == 0  # and it was a valid message to it
        server.publish(TOPICS.server_epoch, {**epoch, "epoch": uuid.uuid4().hex})  # a restart, live
        assert server.wait("hello", 2, 10)
        assert proc.poll() is None  # never thrown out for setting the retain flag
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.client.loop_stop()
        broker.stop()
