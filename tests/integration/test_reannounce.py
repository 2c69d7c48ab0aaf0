"""Server restarts and broker restarts on a real mosquitto: devices say hello again to a new
server epoch, re-offer a result that vanished, and a repeated result counts once
(docs/protocol.md §3.1, §9.5)."""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from sdk_device.agent import DeviceAgent
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid

from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration


class CountingGrid(MqttGrid):
    """An MQTT grid that records every hello and every result delivered to it; with
    ``drop_first_result`` it ignores the first result, as if the broker had lost it."""

    def __init__(self, *args, drop_first_result: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hellos: list[str] = []
        self.results: list[str] = []
        self.dropped = threading.Event()
        self.drop_first_result = drop_first_result

    def _on_hello(self, dev, hello):
        self.hellos.append(dev)
        super()._on_hello(dev, hello)

    def _on_result(self, dev, result):
        self.results.append(result.task_id)
        if self.drop_first_result and not self.dropped.is_set():
            self.dropped.set()
            return
        super()._on_result(dev, result)


def loop_over(fleet: Fleet, grid: MqttGrid, rounds: int = 1) -> RoundLoop:
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    return RoundLoop(FedAvg(spec, RECIPE), grid, LoopConfig(rounds=rounds, round_timeout_s=120.0),
                     run_dir=fleet.root / "server", test_data=(fleet.data.x_test, fleet.data.y_test))


def retained_epoch(fleet: Fleet) -> str:
    """The epoch the broker holds retained for the fleet, read by a fresh subscriber."""
    got, arrived = {}, threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.on_message = lambda c, u, m: (got.update(json.loads(m.payload)), arrived.set())
    client.connect(fleet.broker.host, fleet.broker.port)
    client.subscribe(FleetTopics(fleet.fleet).server_epoch, qos=1)
    client.loop_start()
    try:
        assert arrived.wait(5), "no retained epoch on the broker"
        return got["epoch"]
    finally:
        client.disconnect()
        client.loop_stop()


def pump_until(grid: MqttGrid, condition, timeout_s: float) -> float:
    """Handle the grid's traffic until ``condition()``; the seconds it took."""
    began = time.monotonic()
    while not condition() and time.monotonic() - began < timeout_s:
        grid.poll(0.05)
    return time.monotonic() - began


def test_every_connected_device_says_hello_once_to_a_restarted_server(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    devices = ["a", "b", "c"]
    try:
        first = CountingGrid(fleet.endpoint, fleet.registry)
        for dev, path in fleet.write_data(devices).items():
            fleet.start_process(dev, path)
        assert first.wait_for_devices(3, timeout_s=120) == 3
        pump_until(first, lambda: False, 1.5)  # would catch a second hello per device
        assert sorted(first.hellos) == devices  # joining a running server: one hello each
        first.close()
        fleet.endpoint.close()

        # A new server instance: new endpoint and grid on the same registry and broker.
        fleet.endpoint = Endpoint(fleet.broker, FleetTopics(fleet.fleet), BlobStore(tmp_path / "server2"),
                                  is_known_peer=fleet.registry.is_known).start()
        second = CountingGrid(fleet.endpoint, fleet.registry)
        assert second.epoch.epoch != first.epoch.epoch
        took = pump_until(second, lambda: sorted(second.hellos) == devices, 10)
        assert sorted(second.hellos) == devices, f"hellos after {took:.1f} s: {second.hellos}"
        assert took < 5  # 3 registered devices: a 1 s announce window
        pump_until(second, lambda: False, 1.5)
        assert sorted(second.hellos) == devices  # no duplicates
        assert [d.device_id for d in second.online()] == devices
        assert retained_epoch(fleet) == second.epoch.epoch
        second.close()
    finally:
        fleet.close()


def test_a_result_lost_in_a_broker_restart_is_offered_again_and_accepted(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    try:
        grid = CountingGrid(fleet.endpoint, fleet.registry, drop_first_result=True)
        loop = loop_over(fleet, grid)
        loop.start()
        for dev, path in fleet.write_data(["a"]).items():
            fleet.start_process(dev, path)
        assert grid.wait_for_devices(1, timeout_s=120) == 1

        def restart_broker_when_the_result_is_lost() -> None:
            if grid.dropped.wait(120):  # the server ignored the delivery: as if it never came
                mosquitto.stop(kill=True)  # no clean shutdown: the broker saves nothing
                mosquitto.start()  # same port, empty: sessions and retained messages are gone

        restarter = threading.Thread(target=restart_broker_when_the_result_is_lost, daemon=True)
        restarter.start()
        began = time.monotonic()
        rows = loop.run()
        took = time.monotonic() - began
        restarter.join(timeout=30)
    finally:
        fleet.close()
    assert grid.dropped.is_set()
    assert rows[0]["accepted"] == 1, rows
    assert len(grid.results) >= 2 and len(set(grid.results)) == 1  # the same task, offered again
    assert took < 60  # not the 120 s deadline
    assert len(fleet.registry.updates(1)) == 1


def test_a_repeated_result_is_counted_once_and_acknowledged_again(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    try:
        grid = CountingGrid(fleet.endpoint, fleet.registry)
        loop = loop_over(fleet, grid)
        loop.start()
        path = fleet.write_data(["a"])["a"]
        agent = DeviceAgent(fleet.agent_config("a", path))
        send, results, acks = agent.endpoint.send, [], []

        def send_results_twice(peer, message, **kwargs):
            send(peer, message, **kwargs)
            if isinstance(message, msgs.Result):  # as a QoS-1 redelivery or a re-offer would
                results.append(message)
                send(peer, message, **kwargs)

        handle = agent._handle

        def record_acks(incoming):
            if isinstance(incoming.message, msgs.Ack):
                acks.append(incoming.message.ref)
            handle(incoming)

        agent.endpoint.send, agent._handle = send_results_twice, record_acks
        fleet.start_thread(agent)
        assert grid.wait_for_devices(1, timeout_s=120) == 1
        rows = loop.run()
        assert rows[0]["accepted"] == 1
        task_id = results[0].task_id
        send(SERVER, results[0])  # once more, after the round closed
        pump_until(grid, lambda: acks.count(task_id) >= 2 and len(grid.results) >= 3, 10)
    finally:
        fleet.close()
    assert len(grid.results) >= 3
    assert acks.count(task_id) >= 2  # a duplicate of an accepted result is acknowledged again
    assert [u["task_id"] for u in fleet.registry.updates(1)] == [task_id]  # and counted once
    assert fleet.registry.rejections(1) == []  # never refused as round_closed or unknown
