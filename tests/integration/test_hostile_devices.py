"""Hostile devices and a forger on the broker cost honest devices nothing, and no round waits
for its deadline because of them (issue 28).

Real agents (threads, so some can misbehave) over mosquitto: a device whose update is NaN is
rejected and resolved at once; a device that sends its previous update again is refused as a
replay; a forger that injects one self-consistent forged chunk frame into every pull of the
honest devices' results does not cost them their updates.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from sdk_device.agent import DeviceAgent
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_chunk, sha256_hex
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.mqtt_link import MqttLink
from sdk_device.transport.routes import SERVER

from .harness import Fleet
from .test_faults import NaNUpdate, RecordingAgent, Rogue

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


class Replayer(Rogue):
    """Round 1: a valid update of its own. Later rounds: that same update again (a stale replay)."""

    first: msgs.BlobRef | None = None

    def tamper(self, weights):
        return {k: v * np.float32(0.999) if v.dtype.kind == "f" else v for k, v in weights.items()}

    def send_result(self, task, ref):
        if self.first is None:
            self.first = ref
        else:
            self.endpoint.offer(SERVER, self.endpoint.store.get(self.first.id), "weights", "safetensors")
        super().send_result(task, self.first)


class SlowHolder(Endpoint):
    """Serves each chunk frame 0.3 s late, so that the forger's frame wins the race."""

    def frame_chunk(self, blob, index, size, chunk_bytes, data, sha=None):
        time.sleep(0.3)
        return super().frame_chunk(blob, index, size, chunk_bytes, data, sha)


class Forger:
    """A client on the broker that answers the server's first ``blob_request`` for each result
    record of ``victims`` with a forged frame: other bytes, with their own correct sha256."""

    def __init__(self, fleet: Fleet, victims: list[str]) -> None:
        self.topics = FleetTopics(fleet.fleet)
        self.sizes: dict[str, int] = {}  # blob id -> size, from the victims' results
        self.forged: set[str] = set()
        subscriptions = [t for dev in victims for t in (self.topics.up(dev), self.topics.down(dev))]
        self.link = MqttLink(fleet.broker, "forger", self._on_message, subscriptions=subscriptions,
                             clean_session=True).connect()

    def _on_message(self, topic: str, payload: bytes, retained: bool = False) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            return
        dev = topic.split("/")[-2]
        if message.get("type") == "result":
            self.sizes.update({ref["id"]: ref["size"] for ref in message["arrays"].values()})
        elif message.get("type") == "blob_request" and message["blob"] in self.sizes \
                and message["blob"] not in self.forged:
            self.forged.add(message["blob"])
            blob, size, cb, index = message["blob"], self.sizes[message["blob"]], message["chunk_bytes"], \
                message["indices"][0]
            length = min(cb, size - index * cb)
            data = bytes((i * 7 + 1) % 251 for i in range(length))
            frame = encode_chunk(blob, index, size, cb, data, sha256_hex(data))
            self.link.publish(self.topics.up_chunk(dev), frame)

    def close(self) -> None:
        self.link.close()


def test_a_rejected_device_and_a_replay_do_not_hold_the_round_to_its_deadline(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    kinds = {"good0": RecordingAgent, "good1": RecordingAgent, "nan": NaNUpdate, "replay": Replayer}
    paths = fleet.write_data(list(kinds), "iid")
    try:
        agents = {dev: fleet.start_thread(cls(fleet.agent_config(dev, paths[dev])))
                  for dev, cls in kinds.items()}
        loop = fleet.server(rounds=2, round_timeout_s=DEADLINE_S)
        loop.start()
        assert loop.grid.wait_for_devices(len(kinds), timeout_s=60) == len(kinds)
        rows = loop.run()
    finally:
        fleet.close()
    registry = fleet.registry
    assert [r["accepted"] for r in rows] == [3, 2]
    assert {u["device_id"] for u in registry.updates(2)} == {"good0", "good1"}
    for row in rows:  # every asked device was resolved: the round closed long before its deadline
        assert row["seconds"] < DEADLINE_S / 3, row
    codes = {(r["round"], r["device_id"], r["code"]) for r in registry.rejections()}
    assert {(1, "nan", "non_finite"), (2, "nan", "non_finite"), (2, "replay", "replay")} <= codes, codes
    assert "replay" in {e.code for e in agents["replay"].errors}


def test_a_forged_chunk_in_an_honest_pull_costs_the_device_nothing(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    honest = ["good0", "good1"]
    paths = fleet.write_data(honest, "iid")
    forger = None
    try:
        agents = {}
        for dev in honest:
            config = fleet.agent_config(dev, paths[dev])
            store = BlobStore(config.work_dir / "blobs")
            endpoint = SlowHolder(fleet.broker, FleetTopics(fleet.fleet), store, device_id=dev)
            agents[dev] = fleet.start_thread(DeviceAgent(config, endpoint=endpoint))
        forger = Forger(fleet, honest)
        loop = fleet.server(rounds=1, round_timeout_s=DEADLINE_S)
        loop.start()
        assert loop.grid.wait_for_devices(len(honest), timeout_s=60) == len(honest)
        started = time.monotonic()
        rows = loop.run()
        took = time.monotonic() - started
    finally:
        fleet.close()
        if forger:
            forger.close()
    assert len(forger.forged) == 2  # one forged frame went into each honest device's pull
    assert rows[0]["accepted"] == 2  # both honest updates accepted in the same round
    assert took < DEADLINE_S / 3
    assert fleet.registry.rejections() == []
    assert fleet.endpoint.refetched_chunks >= 2  # the forged chunks, named and fetched again
    assert all(a.tasks_done == 1 for a in agents.values())
