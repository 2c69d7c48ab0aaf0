"""A two-node RabbitMQ cluster (Debian's rabbitmq-server, MQTT plugin, loopback ports): the
server publishes through node A, a device attached to node B — where the server's retained
epoch does not exist, retained messages being per node — learns the server's status and epoch
by its status request (docs/protocol.md §3.2), and a round with a device on each node completes.
The three-node scenario with a node killed mid-round is ``bench/rabbitmq_cluster.py``."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pytest

from fedcore.recipe import Recipe
from sdk_device.agent import DeviceAgent
from sdk_device.protocol.topics import FleetTopics
from server_toolkit.broker.rabbitmq import RabbitCluster, rabbitmq_missing
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid

from .harness import Fleet

pytestmark = pytest.mark.integration

FAST = Recipe(epochs=1, batch_size=16, lr=0.05)


@pytest.fixture
def cluster(tmp_path):
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)  # the issue allows this only where it cannot be installed: make rabbitmq
    with RabbitCluster(tmp_path / "rabbit", size=2) as running:
        yield running


def retained_on(url_host: str, port: int, topic: str, wait_s: float = 2.0) -> bytes | None:
    """The retained payload a fresh subscriber on one node gets for ``topic`` (None: none)."""
    got, arrived = [], threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.on_message = lambda c, u, m: (got.append(m.payload), arrived.set())
    client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
    client.connect(url_host, port)
    client.loop_start()
    try:
        arrived.wait(wait_s)
        return got[0] if got else None
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_device_on_node_b_learns_the_status_and_epoch_the_server_published_through_node_a(
        cluster, tmp_path):
    node_a, node_b = cluster.nodes
    fleet = Fleet(node_a.address, tmp_path)
    try:
        grid = MqttGrid(fleet.endpoint, fleet.registry)
        epoch_topic = FleetTopics(fleet.fleet).server_epoch
        assert retained_on("127.0.0.1", node_a.mqtt_port, epoch_topic) is not None
        assert retained_on("127.0.0.1", node_b.mqtt_port, epoch_topic) is None  # per node
        paths = fleet.write_data(["on-a", "on-b"])
        agents = {}
        for dev, node in (("on-a", node_a), ("on-b", node_b)):
            config = fleet.agent_config(dev, paths[dev])
            config.broker_url = node.url
            agents[dev] = fleet.start_thread(DeviceAgent(config))
        assert grid.wait_for_devices(2, timeout_s=60) == 2
        deadline = time.monotonic() + 30
        while agents["on-b"].announcer.announced is None and time.monotonic() < deadline:
            grid.poll(0.1)
        assert agents["on-b"].announcer.announced == grid.epoch.epoch
        assert agents["on-b"].announcer.server_online
        assert agents["on-b"].announcer.hellos == 1  # the start hello only: it knows its server

        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        loop = RoundLoop(FedAvg(spec, FAST), grid, LoopConfig(rounds=1, round_timeout_s=60.0, min_devices=2),
                         run_dir=fleet.root / "server", test_data=(fleet.data.x_test, fleet.data.y_test))
        loop.start()
        [row] = loop.run()
        assert row["accepted"] == 2, row
        grid.close()
    finally:
        fleet.close()
