"""Task pacing (rounds/task_pacing.py) with a real mosquitto and the device swarm: a server
whose blob serving is slow still gets every device its weights promptly, because it sends a
task only while few devices are pulling, and it accepts results while tasks still go out."""

from __future__ import annotations

import time

import pytest

from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.swarm import Swarm, SwarmConfig

from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration
DEVICES = 200
CHUNK_DELAY_S = 0.025  # per chunk served: a server on a busy machine (about 2 chunks per device)
WINDOW = 10


class SlowEndpoint(Endpoint):
    """A server endpoint that takes CHUNK_DELAY_S to serve each chunk."""

    def frame_chunk(self, *args, **kwargs) -> bytes:
        time.sleep(CHUNK_DELAY_S)
        return super().frame_chunk(*args, **kwargs)


class TimedGrid(MqttGrid):
    """An MQTT grid that notes when it sent its last task and when it accepted its first result."""

    last_send = first_accept = None

    def _send_task(self, *args) -> None:
        super()._send_task(*args)
        self.last_send = time.monotonic()

    def _acknowledge(self, dev: str, task_id: str) -> None:
        self.first_accept = self.first_accept or time.monotonic()
        super()._acknowledge(dev, task_id)


def test_a_slow_server_paces_its_tasks_so_no_device_waits_long_for_its_weights(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    fleet.endpoint.close()
    fleet.endpoint = SlowEndpoint(mosquitto.address, FleetTopics(fleet.fleet), BlobStore(tmp_path / "blobs"),
                                  is_known_peer=fleet.registry.is_known).start()
    config = SwarmConfig(mosquitto.url, fleet.fleet, devices=DEVICES, processes=1, connect_rate=0)
    fleet.registry.add_devices([(dev, None) for dev in config.device_ids()])
    grid = TimedGrid(fleet.endpoint, fleet.registry, task_window=WINDOW)
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    loop = RoundLoop(FedAvg(spec, RECIPE), grid, LoopConfig(rounds=1, round_timeout_s=60),
                     run_dir=tmp_path / "server")
    loop.start()
    try:
        with Swarm(config) as swarm:
            assert grid.wait_for_devices(DEVICES, timeout_s=60) == DEVICES
            rows = loop.run()
            assert swarm.wait(lambda c: c.accepted == DEVICES, timeout_s=10), swarm.counters()
            counters = swarm.counters()
    finally:
        grid.close()
        fleet.close()
    assert (rows[0]["selected"], rows[0]["accepted"], counters.refused) == (DEVICES, DEVICES, 0)
    waits = sorted(u["metrics"]["fetch_s"] for u in fleet.registry.updates(1))  # task in hand -> result
    serving_s = 2 * CHUNK_DELAY_S * DEVICES  # every device's pull, one after another: about 10 s
    # Unpaced, all 200 tasks land at once and the last device waits for every pull before its own.
    assert waits[-1] < serving_s / 3, f"slowest device waited {waits[-1]:.1f} s for its blobs"
    assert grid.first_accept < grid.last_send  # results were accepted while tasks still went out
    print(f"{DEVICES} devices, {rows[0]['seconds']:.1f} s round, "
          f"waits median {waits[len(waits) // 2]:.2f} s, max {waits[-1]:.2f} s")
