"""Secure aggregation over a real mosquitto with ten real device processes: round 1 with
every device, round 2 with three of them (30 %) dropping after the key exchange. Each round's
global weights equal plain FedAvg of the updates the devices trained (read from the devices'
side, test-only dump) within the fixed-point tolerance, and nothing a device published holds
its plain update: no byte run of it in any payload, no correlation with any masked vector."""

from __future__ import annotations

import threading

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.secagg_client import DROP_ENV, DUMP_ENV
from server_toolkit.assembly import aggregation_stack
from server_toolkit.methods.base import ClientUpdate
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.secagg.mqtt_grid import SecAggMqttGrid, SecAggSettings
from server_toolkit.sim.simulate import start_device_process

from .harness import Fleet

pytestmark = pytest.mark.integration

DEVICES = [f"dev{i}" for i in range(10)]
DROPPING = {"dev2", "dev5", "dev8"}  # in round 2
TOLERANCE = 1e-5  # fixed point: <= 0.5 / 2**20 per weighted value, plus float32 rounding


def _capture(url: str, fleet: str) -> tuple[mqtt.Client, list[bytes]]:
    """Every payload the devices publish towards the server (control messages and chunks)."""
    payloads: list[bytes] = []
    lock = threading.Lock()
    host, port = url.removeprefix("mqtt://").split(":")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="secagg-test-capture")

    def on_message(_client, _userdata, message):
        with lock:
            payloads.append(bytes(message.payload))

    client.on_message = on_message
    client.connect(host, int(port))
    client.subscribe(f"fedsdk/v1/{fleet}/dev/+/up/#", qos=1)
    client.subscribe(f"fedsdk/v1/{fleet}/dev/+/up", qos=1)
    client.loop_start()
    return client, payloads


def _plain_updates(dump, rnd: int, instruction_of) -> list[ClientUpdate]:
    out = []
    for path in sorted((dump / f"round{rnd}").glob("*.safetensors")):
        dev = path.stem
        samples = int(__import__("json").loads(path.with_suffix(".json").read_text())["samples"])
        out.append(ClientUpdate(dev, samples, decode_tensors(path.read_bytes()), {}, instruction_of(dev)))
    return out


def test_secure_rounds_equal_plain_fedavg_with_and_without_drops_and_never_carry_a_plain_update(
        mosquitto, tmp_path, monkeypatch):
    fleet = Fleet(mosquitto.address, tmp_path)
    dump = tmp_path / "dump"
    capture, payloads = _capture(mosquitto.url, fleet.fleet)
    try:
        paths = fleet.write_data(DEVICES)
        monkeypatch.setenv(DUMP_ENV, str(dump))
        for dev in DEVICES:
            if dev in DROPPING:
                monkeypatch.setenv(DROP_ENV, "after_shares:2")
            else:
                monkeypatch.delenv(DROP_ENV, raising=False)
            fleet.registry.add_device(dev)
            fleet.procs.append(start_device_process(mosquitto.url, fleet.fleet, dev, paths[dev],
                                                    tmp_path / dev / "work", tmp_path / f"{dev}.log",
                                                    runtime="torch"))
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        method = FedAvg(spec, Recipe(epochs=1, batch_size=32, lr=0.05))
        grid = SecAggMqttGrid(fleet.endpoint, fleet.registry, method, SecAggSettings(stage_timeout_s=30))
        received: list[np.ndarray] = []
        pull = grid._pull_masked
        grid._pull_masked = lambda dev, data, length: received.append(pull(dev, data, length)) or received[-1]
        loop = RoundLoop(method, grid, LoopConfig(rounds=2, norm_bound=None, round_timeout_s=90),
                         aggregator=aggregation_stack(method, None, secure=True))
        loop.start()
        assert grid.wait_for_devices(len(DEVICES), timeout_s=120) == len(DEVICES)

        for rnd, survivors in ((1, len(DEVICES)), (2, len(DEVICES) - len(DROPPING))):
            before = dict(loop.global_weights)
            instructions = {}
            row = loop.run_round(rnd)
            assert row["accepted"] == survivors, row
            assert sorted(grid.last_secure.dropped) == (sorted(DROPPING) if rnd == 2 else [])
            for u in loop.last_updates:
                instructions[u.device_id] = u.instruction
                assert u.weights == {}  # the loop never held an update, only metrics
            plain = _plain_updates(dump, rnd, instructions.__getitem__)
            assert {u.device_id for u in plain} == set(instructions)
            expected = FedAvg(spec, method.recipe).aggregate_train(rnd, before, plain)
            for name, value in expected.items():
                assert np.abs(loop.global_weights[name] - value).max() <= TOLERANCE, name
            assert any(np.abs(loop.global_weights[n] - before[n]).max() > 1e-3 for n in before)
        grid.close()
    finally:
        capture.loop_stop()
        capture.disconnect()
        fleet.close()

    assert len(received) == len(DEVICES) + len(DEVICES) - len(DROPPING)
    everything = b"".join(payloads)
    assert received[0].astype("<u8").tobytes()[:4096] in everything  # the capture saw the uploads
    for rnd in (1, 2):
        for path in (dump / f"round{rnd}").glob("*.safetensors"):
            update = decode_tensors(path.read_bytes())
            biggest = max(update.values(), key=lambda v: v.size)
            raw = np.ascontiguousarray(biggest, "<f4").tobytes()
            assert not any(raw[i: i + 32] in everything for i in range(0, len(raw) - 32, 4096)), path
            plain = biggest.ravel().astype(np.float64)
            for vector in received:
                masked = vector[: plain.size].view(np.int64).astype(np.float64)
                assert abs(np.corrcoef(plain, masked)[0, 1]) < 0.1
