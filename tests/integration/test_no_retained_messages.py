"""A broker without retained messages (mosquitto ``retain_available false``, which disconnects
any client that publishes one): with ``?retain=0`` devices join, rounds complete, and a server
restarted while the devices were away — their sessions lost — gets a hello from every one of
them through the status request (docs/protocol.md §3.2), the only way left to learn its epoch."""

from __future__ import annotations

import signal
import time
from dataclasses import replace

import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop

from .harness import Fleet
from .test_reannounce import CountingGrid, pump_until

pytestmark = pytest.mark.integration

FAST = Recipe(epochs=1, batch_size=16, lr=0.05)
DEVICES = ["a", "b", "c"]


def one_round(fleet: Fleet, grid: CountingGrid, run_dir: str) -> dict:
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    loop = RoundLoop(FedAvg(spec, FAST), grid, LoopConfig(rounds=1, round_timeout_s=60.0, min_devices=3),
                     run_dir=fleet.root / run_dir, test_data=(fleet.data.x_test, fleet.data.y_test))
    loop.start()
    [row] = loop.run()
    return row


def test_without_retained_messages_rounds_complete_and_a_restarted_server_hears_every_device(tmp_path):
    broker = MosquittoBroker(workdir=tmp_path / "mosquitto", persistence=False,
                             extra_config="retain_available false").start()
    fleet = Fleet(replace(broker.address, retain=False), tmp_path)
    try:
        first = CountingGrid(fleet.endpoint, fleet.registry)
        for dev, path in fleet.write_data(DEVICES).items():
            fleet.start_process(dev, path)  # fedsdk run --broker mqtt://…?retain=0
        assert first.wait_for_devices(3, timeout_s=120) == 3
        assert one_round(fleet, first, "server")["accepted"] == 3
        first.close()
        fleet.endpoint.close()

        # The devices are away while the broker restarts empty (sessions lost) and a new server
        # starts: its epoch, broadcast live, reaches none of them.
        for proc in fleet.procs:
            proc.send_signal(signal.SIGSTOP)
        broker.stop(kill=True)
        broker.start()
        fleet.endpoint = Endpoint(fleet.broker, FleetTopics(fleet.fleet), BlobStore(tmp_path / "server2"),
                                  is_known_peer=fleet.registry.is_known).start()
        second = CountingGrid(fleet.endpoint, fleet.registry)
        pump_until(second, lambda: False, 1.0)
        began = time.monotonic()
        for proc in fleet.procs:
            proc.send_signal(signal.SIGCONT)
        took = pump_until(second, lambda: sorted(second.hellos) == DEVICES, 40)
        assert sorted(second.hellos) == DEVICES, f"hellos after {took:.1f} s: {second.hellos}"
        assert time.monotonic() - began < 40
        assert all(p.poll() is None for p in fleet.procs)  # no device was thrown out for retaining
        assert one_round(fleet, second, "server2")["accepted"] == 3
        second.close()
    finally:
        fleet.close()
        broker.stop()
