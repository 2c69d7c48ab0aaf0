"""The device swarm against a real server grid and a real mosquitto: rounds at fleet scale."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from server_toolkit.fleet.device_ids import numbered_ids
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.swarm import Swarm, SwarmConfig
from server_toolkit.swarm.shard import _doomed

from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _register(fleet: Fleet, config: SwarmConfig) -> None:
    for dev in config.device_ids():
        fleet.registry.add_device(dev)


def test_a_thousand_swarm_devices_finish_two_rounds_with_every_update_accepted(mosquitto, tmp_path):
    started = time.monotonic()
    fleet = Fleet(mosquitto.address, tmp_path)
    config = SwarmConfig(mosquitto.url, fleet.fleet, devices=1000, processes=4, connect_rate=500)
    _register(fleet, config)
    loop = fleet.server(rounds=2, round_timeout_s=90)
    loop.start()
    initial = {k: v.copy() for k, v in loop.global_weights.items()}
    try:
        with Swarm(config) as swarm:
            assert swarm.wait(lambda c: c.connected == 1000, timeout_s=60), swarm.counters()
            assert loop.grid.wait_for_devices(1000, timeout_s=60) == 1000
            rows = loop.run()
            assert swarm.wait(lambda c: c.accepted == 2000, timeout_s=10), swarm.counters()
            counters = swarm.counters()
    finally:
        loop.grid.close()
        fleet.close()
    assert [(r["round"], r["selected"], r["accepted"]) for r in rows] == [(1, 1000, 1000), (2, 1000, 1000)]
    assert all(not r["rejected"] for r in rows)
    assert (counters.tasks, counters.results, counters.refused) == (2000, 2000, 0)
    assert len(fleet.registry.updates(2)) == 1000
    assert any(not np.allclose(loop.global_weights[k], initial[k]) for k in initial)  # the deltas count
    print(f"1000 swarm devices, 2 rounds: {time.monotonic() - started:.1f} s "
          f"(rounds {rows[0]['seconds']:.1f} s, {rows[1]['seconds']:.1f} s)")


def test_swarm_devices_that_die_on_their_task_do_not_hold_the_round(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    config = SwarmConfig(mosquitto.url, fleet.fleet, devices=40, processes=2, connect_rate=0,
                         fail_fraction=0.25)
    doomed = sum(_doomed(dev, 0.25) for dev in config.device_ids())
    assert 0 < doomed < 40
    _register(fleet, config)
    loop = fleet.server(rounds=1, round_timeout_s=60)
    loop.start()
    try:
        with Swarm(config) as swarm:
            assert loop.grid.wait_for_devices(40, timeout_s=60) == 40
            rows = loop.run()
            assert swarm.wait(lambda c: c.vanished == doomed, timeout_s=5), swarm.counters()
    finally:
        loop.grid.close()
        fleet.close()
    assert rows[0]["selected"] == 40
    assert rows[0]["accepted"] == 40 - doomed
    assert rows[0]["seconds"] < 30  # their last wills ended the wait, not the 60 s deadline


def test_the_swarm_command_connects_its_devices_and_they_say_hello(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    fleet.registry.add_devices([(dev, None) for dev in numbered_ids("cli-", 5)])  # devices add --count 5
    loop = fleet.server(rounds=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server_toolkit.cli", "swarm", "--broker", mosquitto.url,
         "--fleet", fleet.fleet, "--devices", "5", "--processes", "2", "--prefix", "cli-",
         "--duration", "6", "--status-every", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        assert loop.grid.wait_for_devices(5, timeout_s=30) == 5
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        loop.grid.close()
        fleet.close()
    assert proc.returncode == 0, output
    assert "5/5 connected" in output
    assert sorted(d.device_id for d in loop.grid.online()) == [f"cli-{i}" for i in range(5)]
    assert fleet.registry.device("cli-3")["num_samples"] >= 50  # its hello reached the registry


class HelloCountingGrid(MqttGrid):
    """An MQTT grid that records the device id of every hello delivered to it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hellos: list[str] = []

    def _on_hello(self, dev, hello):
        self.hellos.append(dev)
        super()._on_hello(dev, hello)


def test_a_swarm_says_hello_once_to_a_restarted_server_and_finishes_its_next_round(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    config = SwarmConfig(mosquitto.url, fleet.fleet, devices=300, processes=2, connect_rate=0, heartbeat_s=1)
    ids = config.device_ids()
    fleet.registry.add_devices([(dev, None) for dev in ids])
    first = HelloCountingGrid(fleet.endpoint, fleet.registry)
    try:
        with Swarm(config) as swarm:
            assert first.wait_for_devices(300, timeout_s=60) == 300
            time.sleep(2)  # a second hello per device (the retained "online") would arrive now
            first.poll(0.5)
            assert sorted(first.hellos) == ids  # joining a running server: one hello each
            first.close()
            fleet.endpoint.close()  # the server is gone (orderly: status offline)

            # A new server instance: new endpoint and grid on the same registry and broker.
            fleet.endpoint = Endpoint(fleet.broker, FleetTopics(fleet.fleet), BlobStore(tmp_path / "server2"),
                                      is_known_peer=fleet.registry.is_known).start()
            second = HelloCountingGrid(fleet.endpoint, fleet.registry)
            spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
            loop = RoundLoop(FedAvg(spec, RECIPE), second, LoopConfig(rounds=1, round_timeout_s=60),
                             run_dir=tmp_path / "server", test_data=(fleet.data.x_test, fleet.data.y_test))
            loop.start()
            assert second.epoch.epoch != first.epoch.epoch
            began = time.monotonic()
            while sorted(second.hellos) != ids and time.monotonic() - began < 20:
                second.poll(0.05)
            took = time.monotonic() - began
            assert sorted(second.hellos) == ids, f"{len(set(second.hellos))} hellos after {took:.1f} s"
            assert took < 10  # 300 registered devices: a 1 s announce window
            assert sorted(d.device_id for d in second.online()) == ids
            rows = loop.run()
            assert swarm.wait(lambda c: c.accepted == 300, timeout_s=10), swarm.counters()
            counters = swarm.counters()
            assert sorted(set(second.hellos)) == ids and len(second.hellos) == 300  # no duplicates
            second.close()
    finally:
        fleet.close()
    assert (rows[0]["selected"], rows[0]["accepted"]) == (300, 300)
    assert counters.hellos == 600  # one at start, one to the new epoch: never one per "online"
    assert counters.connected == 300 and counters.connects == 300  # nobody lost the broker
