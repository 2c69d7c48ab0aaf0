"""The server's message path over a real mosquitto: results go before queued hellos, and
traffic from ids outside the fleet is counted and rate-limited (one reply, one registry row
and one log line per id a minute)."""

from __future__ import annotations

import logging
import time

import paho.mqtt.client as mqtt
import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.rounds.mqtt_grid import MqttGrid

pytestmark = pytest.mark.integration
TOPICS = FleetTopics("hot")


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _client(broker, client_id: str, received: list | None = None) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.max_inflight_messages_set(100)
    if received is not None:
        client.on_message = lambda c, u, m: received.append(msgs.decode(m.payload))
    client.connect(broker.address.host, broker.address.port)
    client.loop_start()
    return client


def _hello(dev: str) -> bytes:
    return msgs.encode(msgs.Hello(device_id=dev, runtimes=["torch"], num_samples=10, profile={}))


@pytest.fixture
def server(mosquitto, tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    endpoint = Endpoint(mosquitto.address, TOPICS, BlobStore(tmp_path / "blobs"),
                        is_known_peer=registry.is_known)
    grid = MqttGrid(endpoint.start(), registry)
    yield grid
    grid.close()
    endpoint.close()
    registry.close()


def test_a_result_is_handled_before_thousands_of_hellos_queued_ahead_of_it(mosquitto, server):
    grid, count = server, 2000
    ids = [f"dev-{i:04d}" for i in range(count)]
    grid.registry.add_devices([(d, None) for d in ids])
    online_at_result: list[int] = []
    on_result = grid._on_result
    grid._on_result = lambda dev, result: (online_at_result.append(len(grid.devices)), on_result(dev, result))
    publisher = _client(mosquitto, "publisher")
    for dev in ids:
        publisher.publish(TOPICS.up(dev), _hello(dev), qos=1)
    result = msgs.Result(task_id="0" * 32, round=1, arrays={}, metrics={"samples": 1})
    publisher.publish(TOPICS.up(ids[-1]), msgs.encode(result), qos=1)
    _wait_for(lambda: grid.endpoint.inbox.qsize() == count + 1)  # everything waits; the result arrived last
    grid.poll(0.1)
    assert online_at_result == [0]  # handled first, ahead of every hello
    started = time.monotonic()
    while len(grid.devices) < count and time.monotonic() - started < 30:
        grid.poll(0.1)
    assert len(grid.devices) == count and time.monotonic() - started < 10  # measured: ~0.05 s
    assert [r["code"] for r in grid.registry.rejections()] == ["unknown_task"]
    publisher.loop_stop()
    publisher.disconnect()


def test_an_unknown_id_costs_one_reply_one_row_and_one_log_line_a_minute(mosquitto, server, caplog):
    grid = server
    caplog.set_level(logging.WARNING, logger="sdk_device.transport.endpoint")
    replies: dict[str, list] = {"stranger-1": [], "stranger-2": []}
    clients = []
    for dev, received in replies.items():
        client = _client(mosquitto, dev, received)
        client.subscribe(TOPICS.down(dev), qos=1)
        clients.append(client)
    time.sleep(0.3)  # subscriptions in place
    for _ in range(50):
        for client, dev in zip(clients, replies, strict=True):
            client.publish(TOPICS.up(dev), _hello(dev), qos=1)
    _wait_for(lambda: grid.endpoint.strangers.total == 100)
    while grid.endpoint.inbox.qsize():
        grid.poll(0.1)
    time.sleep(0.5)  # any further reply would have arrived
    assert {dev: [(m.TYPE, m.code) for m in got] for dev, got in replies.items()} == {
        "stranger-1": [("error", "unknown_device")], "stranger-2": [("error", "unknown_device")]}
    assert sorted((r["device_id"], r["code"]) for r in grid.registry.rejections()) == [
        ("stranger-1", "unknown_device"), ("stranger-2", "unknown_device")]
    lines = [r.getMessage() for r in caplog.records if "not in this fleet" in r.getMessage()]
    assert len(lines) == 2 and any("'stranger-1'" in line for line in lines)
    assert grid.registry.device("stranger-1") is None and not grid.devices
    for client in clients:
        client.loop_stop()
        client.disconnect()
